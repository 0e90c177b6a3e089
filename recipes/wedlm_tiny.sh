#!/usr/bin/env bash
# The shipped tiny WeDLM (models/wedlm-tiny) from an empty runs/ folder: data -> AR -> WeDLM stages
# -> export -> decoding defaults -> evaluation -> model card. About 20 hours on a quiet 2-core CPU;
# the stages table of docs/training.md lists each stage's config, data and minutes.
#
#   mkdir -p runs/wedlm-tiny && nohup bash recipes/wedlm_tiny.sh > runs/wedlm-tiny/recipe.log 2>&1 &
#   DRY_RUN=1 bash recipes/wedlm_tiny.sh     # print the plan, run nothing
#
# Resumable: rerun the same command; finished steps are skipped and an interrupted stage continues
# from its last checkpoint. The run owns both cores (tokens/s in runs/wedlm-tiny/*/log.jsonl shows
# when something else runs); wall clock per step goes to runs/wedlm-tiny/stages.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/wedlm-tiny
OUT=models/wedlm-tiny
PY=${PYTHON:-python}
mkdir -p "$RUN"
source recipes/stages.sh  # stage, mix, train, convert, grow, export_model

# -- data: the byte-level BPE tokenizer (only when $OUT has none) and the curriculum's
#    train / val / test splits (counting, two-digit sums and differences, list operations)
if todo "$OUT/tokenizer.json"; then stage tokenizer $PY -m wedlm.data.build --out data --tokenizer-out "$OUT"; fi
if todo data/curriculum/train.jsonl; then stage data $PY -m wedlm.data.curriculum --out data/curriculum; fi

# -- 4 layers: AR from scratch, then WeDLM (dual-stream masking + AR loss, 8 learnable <|im_end|>)
train configs/tiny_ar.yaml
convert "$RUN/ar/final" "$RUN/ar-wedlm"
train configs/tiny_wedlm.yaml
train configs/tiny_wedlm_cont.yaml

# -- reading the end value: 1-6-term ranges, then mixes that bring every task back
if todo data/stop2/simple_stop.jsonl; then
  stage data-simple $PY -m wedlm.data.curriculum --out data/stop2 --simple-stop 200000
fi
train configs/tiny_wedlm_simple.yaml
mix data/widen/v4mix.jsonl '{"seed": 5, "simple": {"6": 30000, "15": 10000}, "short": {"20": 10000},
  "replay": {"count": 5000, "addsub": 25000, "listops": 25000}}'
train configs/tiny_wedlm_mix.yaml
mix data/widen/v7mix.jsonl '{"seed": 8, "simple": {"6": 20000, "15": 10000}, "simple_forms": {"6": 20000},
  "short": {"20": 10000}, "replay": {"count": 5000, "addsub": 30000, "listops": 30000}}'
train configs/tiny_wedlm_forms.yaml

# -- stopping on every digit of the end value: steps of 10, then ranges in which an earlier value
#    ends like the end value (distractors)
if todo data/widen/tens10.jsonl; then
  stage data-tens10 $PY -m wedlm.data.curriculum --out data/widen/tens10.jsonl --tens 45000
fi
train configs/tiny_wedlm_tens10.yaml
mix data/widen/v10mix.jsonl '{"seed": 11, "distractor": {"30": 22000}, "simple_forms": {"6": 8000},
  "replay": {"count": 6000, "addsub": 25000, "listops": 20000}}'
train configs/tiny_wedlm_tens.yaml
mix data/widen/v11mix.jsonl '{"seed": 12, "distractor": {"30": 32000}, "replay": {"count": 3000, "addsub": 6000, "listops": 7000}}'
train configs/tiny_wedlm_tens.yaml data=data/widen/v11mix.jsonl init=$RUN/wedlm-tens/final out_dir=$RUN/wedlm-tens2 \
  seed=17 lr=1.0e-3 max_steps=1200 max_minutes=40
mix data/widen/v12mix.jsonl '{"seed": 13, "distractor": {"30": 24000}, "simple_forms": {"6": 6000},
  "replay": {"count": 6000, "addsub": 6000, "listops": 8000}}'
train configs/tiny_wedlm_tens.yaml data=data/widen/v12mix.jsonl init=$RUN/wedlm-tens2/final out_dir=$RUN/wedlm-tens3 \
  seed=18 lr=7.0e-4 max_steps=1200 max_minutes=38 mask_end_weight=20.0

# -- suffix masking: half of the prediction-stream blocks mask their last tokens
mix data/widen/v14mix.jsonl '{"seed": 15, "distractor": {"30": 12000}, "simple_forms": {"6": 4000},
  "replay": {"count": 4000, "addsub": 15000, "listops": 10000}}'
train configs/tiny_wedlm_suffix.yaml
mix data/widen/v15mix.jsonl '{"seed": 16, "distractor": {"30": 14000}, "simple_forms": {"6": 6000},
  "replay": {"count": 5000, "addsub": 15000, "listops": 10000}}'
train configs/tiny_wedlm_suffix.yaml data=data/widen/v15mix.jsonl init=$RUN/wedlm-tens5/final out_dir=$RUN/wedlm-tens6 \
  seed=21 lr=5.0e-4 max_steps=1200 max_minutes=40
mix data/widen/v16mix.jsonl '{"seed": 17, "distractor": {"30": 12000}, "simple_forms": {"6": 10000},
  "replay": {"count": 5000, "addsub": 12000, "listops": 10000}}'
train configs/tiny_wedlm_suffix.yaml data=data/widen/v16mix.jsonl init=$RUN/wedlm-tens6/final out_dir=$RUN/wedlm-tens7 \
  seed=22 max_steps=1000

# -- 8 layers: each layer followed by a zero-output copy (same logits), then five stages of one mix,
#    each on freshly drawn records, bf16 autocast; the last weights each block's leftmost mask 4x
grow "$RUN/wedlm-tens7/final" "$RUN/grow8"
MIX='"distractor": {"30": 12000}, "simple_forms": {"6": 10000}, "replay": {"count": 5000, "addsub": 12000, "listops": 10000}}'
mix data/widen/v17mix.jsonl "{\"seed\": 18, $MIX"
train configs/tiny_wedlm_deep.yaml
prev=wedlm-deep
for k in 2 3 4 5; do
  mix "data/widen/v$((16 + k))mix.jsonl" "{\"seed\": $((17 + k)), $MIX"
  extra=(); [ "$k" = 5 ] && extra=(first_mask_weight=4.0)
  train configs/tiny_wedlm_deep.yaml "data=data/widen/v$((16 + k))mix.jsonl" "init=$RUN/$prev/final" \
    "out_dir=$RUN/wedlm-deep$k" "seed=$((23 + k))" "${extra[@]}"
  prev=wedlm-deep$k
done

# -- two-digit distractors (an earlier value ends in the end value's last two digits) and sums next
#    to a change in their digit count; then the mask stream's end weight 40 -> 8
mix data/widen/v27mix.jsonl '{"seed": 28, "distractor": {"30": 12000}, "distractor2": {"50": 5000},
  "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
train configs/tiny_wedlm_deep11.yaml
mix data/widen/v28mix.jsonl '{"seed": 29, "distractor": {"30": 12000}, "distractor2": {"50": 5000}, "carry": {"20": 8000},
  "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
train configs/tiny_wedlm_deep12.yaml
mix data/widen/v29mix.jsonl '{"seed": 30, "distractor": {"30": 16000}, "distractor2": {"50": 8000}, "carry": {"20": 12000},
  "simple_forms": {"6": 10000}, "replay": {"count": 12000, "addsub": 20000, "listops": 10000}}'
train configs/tiny_wedlm_deep13.yaml
mix data/widen/v30mix.jsonl '{"seed": 31, "distractor": {"30": 12000}, "distractor2": {"50": 8000}, "carry": {"20": 8000},
  "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
train configs/tiny_wedlm_deep14.yaml

# -- random block offsets (a short answer's end slot learns to say "end" without its last tokens)
mix data/widen/v33mix.jsonl '{"seed": 33, "distractor": {"30": 12000}, "distractor2": {"50": 8000}, "carry": {"20": 8000},
  "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
train configs/tiny_wedlm_offset.yaml

# -- reading the end of "Count from A to N." from small starts (A = 1 in 60%, N up to 320) with the
#    demo range 1..200 at its natural rate (`replay_demo: 0`); then ranges ending in 100..320, where
#    only N's hundreds digit decides the stop (twice, on fresh draws); then every task replayed at a
#    low learning rate
mix data/widen/from-one-mix.jsonl '{"seed": 34, "from_small": {"320": 14000}, "distractor": {"30": 6000},
  "distractor2": {"50": 6000}, "carry": {"20": 6000}, "simple_forms": {"6": 6000},
  "replay": {"count": 5000, "addsub": 12000, "listops": 10000}, "replay_demo": 0.0}'
train configs/tiny_wedlm_from_one.yaml
mix data/widen/hundreds-mix.jsonl '{"seed": 35, "from_small": {"100-320": 12000, "320": 4000}, "distractor2": {"50": 4000},
  "carry": {"20": 4000}, "simple_forms": {"6": 4000}, "replay": {"count": 4000, "addsub": 10000, "listops": 8000},
  "replay_demo": 0.0}'
train configs/tiny_wedlm_hundreds.yaml
mix data/widen/hundreds2-mix.jsonl '{"seed": 36, "from_small": {"100-320": 12000, "320": 4000}, "distractor2": {"50": 4000},
  "carry": {"20": 4000}, "simple_forms": {"6": 4000}, "replay": {"count": 4000, "addsub": 10000, "listops": 8000},
  "replay_demo": 0.0}'
train configs/tiny_wedlm_hundreds.yaml init=$RUN/hundreds/final out_dir=$RUN/hundreds2 \
  data=data/widen/hundreds2-mix.jsonl num_threads=2 max_minutes=52 lr=1.5e-4
mix data/widen/replay-mix.jsonl '{"seed": 37, "from_small": {"100-320": 5000, "320": 3000}, "distractor": {"30": 10000},
  "distractor2": {"50": 6000}, "carry": {"20": 6000}, "simple_forms": {"6": 8000},
  "replay": {"count": 10000, "addsub": 10000, "listops": 10000}, "replay_demo": 0.0}'
train configs/tiny_wedlm_hundreds.yaml init=$RUN/hundreds2/final out_dir=$RUN/replay seed=43 \
  data=data/widen/replay-mix.jsonl max_minutes=70 lr=1.0e-4

# -- export, decoding defaults tuned on the validation split, evaluation on the test split, card
export_model "$RUN/replay/final" "$OUT"
stage tune $PY recipes/tune_decoding.py --model "$OUT" --out "$RUN/tune.json" --write \
  --n count=400,addsub=100,listops=150 --windows 16,32 --stop-by-ar 1,run --pairs 0.15:0.015,0.15:0.0075
stage eval $PY recipes/eval_wedlm_tiny.py --model "$OUT" --out "$RUN/eval" \
  --n-count 200 --n-addsub 100 --n-listops 150 --probe-items 20
stage card $PY recipes/model_card.py --eval "$RUN/eval/summary.json" --out "$OUT/README.md"
echo "=== recipe done: $OUT"
