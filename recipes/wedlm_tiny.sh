#!/usr/bin/env bash
# End-to-end recipe of the shipped tiny WeDLM (models/wedlm-tiny), the paper's pipeline at toy scale,
# from scratch in about 100 minutes on a quiet 2-core CPU:
#   1. tokenizer (byte-level BPE, only when models/wedlm-tiny has none: python -m wedlm.data.build)
#      and the curriculum's chat records (python -m wedlm.data.curriculum: counting, two-digit
#      addition/subtraction, list operations; disjoint train / val / test splits)
#   2. AR training from scratch             (configs/tiny_ar.yaml, 30 min)
#   3. AR -> WeDLM conversion               (wedlm convert: adds the [MASK] token)
#   4. WeDLM training: dual-stream masking + AR loss, 8 learnable <|im_end|> (configs/tiny_wedlm.yaml, 65 min)
#   5. export config.json + model.safetensors + generation_config.json into models/wedlm-tiny
#   6. only with CONTINUE=1: continued WeDLM training of the exported weights on records the
#      earlier stages never read, less counting (configs/tiny_wedlm_cont.yaml, 92 min),
#      exported over models/wedlm-tiny.
#   7. only with V4=1 (implies CONTINUE=1): WeDLM training on 1-6-term "Count from A to B." records
#      until the model reads the end value B (configs/tiny_wedlm_simple.yaml, 420 steps, ~12 min), then on a mix
#      that keeps those records and brings back every task (configs/tiny_wedlm_mix.yaml, 660 steps, ~18 min),
#      then on unseen records with more arithmetic and list operations and short ranges of every
#      counting form (configs/tiny_wedlm_forms.yaml, 850 steps, ~24 min; all three fp32),
#      exported over models/wedlm-tiny. The model card's lineage says which steps the shipped weights are.
#   8. only with V5=1 (implies V4=1): the stop beyond B's last digit. Steps of 10 alone with the stop
#      weighted 20x (configs/tiny_wedlm_tens10.yaml, 875 steps, ~27 min), then three mixes of
#      last-digit distractor ranges of every form, arithmetic and list operations with both stops
#      weighted (configs/tiny_wedlm_tens.yaml, tiny_wedlm_tens2.yaml, tiny_wedlm_tens3.yaml;
#      1,500 + 1,200 + 1,200 steps, ~110 min; all fp32), exported over models/wedlm-tiny.
#   9. only with V6=1 (implies V5=1): suffix masking. Half of the prediction-stream blocks mask their
#      last tokens, the shape streaming decoding shows its leftmost mask (configs/tiny_wedlm_tens5.yaml,
#      tiny_wedlm_tens6.yaml, tiny_wedlm_tens7.yaml; 700 + 1,200 + 1,000 steps, ~58 min, fp32),
#      exported over models/wedlm-tiny.
#  10. only with V7=1 (implies V6=1): depth. Version 6 grown to 8 layers (python -m wedlm.train.grow:
#      each layer followed by a copy whose o_proj and down_proj are zero, same logits), then two stages
#      of the version 6 mix on unseen records (configs/tiny_wedlm_deep.yaml, tiny_wedlm_deep2.yaml;
#      1,000 + 1,000 steps, ~80 min, bf16 autocast), exported over models/wedlm-tiny (unless V8=1).
#  11. only with V8=1 (implies V7=1): three more stages of the same mix on unseen records, the last
#      with each block's leftmost masked token weighted 4x (configs/tiny_wedlm_deep3.yaml,
#      tiny_wedlm_deep4.yaml, tiny_wedlm_deep5.yaml; 3 x 1,000 steps, ~120 min, bf16 autocast),
#      exported over models/wedlm-tiny (with V9=1 too: step 12 starts from that export).
#  12. only with V9=1 (implies V8=1): version 8 continued by two stages (the first inits from
#      models/wedlm-tiny) on unseen records with two-digit distractor ranges (an earlier value ends
#      in B's last two digits), the AR stop weight at 1 and the mask stream's end weight at 40
#      (configs/tiny_wedlm_deep11.yaml, 2,000 steps, ~70 min), then the same with sums and
#      differences next to a change in their digit count added, at half the learning rate
#      (configs/tiny_wedlm_deep12.yaml, 1,000 steps, ~35 min; both bf16 autocast), exported over
#      models/wedlm-tiny (unless V10=1).
#  13. only with V10=1 (implies V9=1): version 9 continued by two stages on freshly drawn records:
#      more last-two-digit distractor ranges, carry sums and arithmetic (configs/tiny_wedlm_deep13.yaml,
#      80 min annealed on the clock), then the mask stream's end weight 40 -> 8
#      (configs/tiny_wedlm_deep14.yaml, 30 min; both bf16 autocast and compiled: `compile: true`),
#      exported over models/wedlm-tiny: the shipped version 10.
#  14. only with TRIAL_EDGE=1 (implies V10=1): a trial that was NOT shipped (docs/training.md, "Range
#      endpoints"): version 10 continued by one stage with ranges that start near 0 or end next to a
#      change in the number of digits (configs/tiny_wedlm_deep15.yaml, 40 min, bf16 autocast,
#      compiled), exported to runs/wedlm-tiny/trial-edge (models/wedlm-tiny keeps version 10).
#  15. only with V11=1 (implies V10=1): version 10 continued by one stage with random block offsets
#      (`random_block_offset: true`: each document's prediction-stream blocks start at a random offset,
#      so a short answer's end slot also learns to say "end" without seeing the answer's last tokens;
#      configs/tiny_wedlm_deep17.yaml, 50 min, bf16 autocast, compiled), exported over models/wedlm-tiny.
# Resumable: rerun the same command; finished stages are skipped (their final/ exists) and an
# interrupted stage continues from its last checkpoint. The run owns both cores: start nothing
# else meanwhile (tokens/s in runs/wedlm-tiny/*/log.jsonl shows when something does).
# Wall clock per stage goes to runs/wedlm-tiny/stages.jsonl.
#
#   mkdir -p runs/wedlm-tiny && nohup bash recipes/wedlm_tiny.sh > runs/wedlm-tiny/recipe.log 2>&1 &
# Then tune decoding on the validation split, evaluate on the test split and write the model card:
#   python recipes/tune_decoding.py
#   python recipes/eval_wedlm_tiny.py
#   python recipes/model_card.py
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/wedlm-tiny
OUT=models/wedlm-tiny
mkdir -p "$RUN"
PY=${PYTHON:-python}

source recipes/stages.sh  # stage, mix_stage

if [ ! -f "$OUT/tokenizer.json" ]; then
  stage tokenizer $PY -m wedlm.data.build --out data --tokenizer-out "$OUT"
fi
[ -f data/curriculum/train.jsonl ] || stage data $PY -m wedlm.data.curriculum --out data/curriculum
stage ar      $PY -m wedlm.cli.main train --config configs/tiny_ar.yaml
[ -f "$RUN/ar-wedlm/config.json" ] || stage convert $PY -m wedlm.cli.main convert "$RUN/ar/final" "$RUN/ar-wedlm"
stage wedlm   $PY -m wedlm.cli.main train --config configs/tiny_wedlm.yaml
[ -f "$RUN/wedlm-cont/final/config.json" ] || stage export $PY -m wedlm.train.export "$RUN/wedlm/final" "$OUT"
[ "${V11:-0}" = 1 ] && V10=1
[ "${TRIAL_EDGE:-0}" = 1 ] && V10=1
[ "${V10:-0}" = 1 ] && V9=1
[ "${V9:-0}" = 1 ] && V8=1
[ "${V8:-0}" = 1 ] && V7=1
[ "${V7:-0}" = 1 ] && V6=1
[ "${V6:-0}" = 1 ] && V5=1
[ "${V5:-0}" = 1 ] && V4=1
[ "${V4:-0}" = 1 ] && CONTINUE=1
if [ "${CONTINUE:-0}" = 1 ]; then
  stage wedlm-cont $PY -m wedlm.cli.main train --config configs/tiny_wedlm_cont.yaml
  [ -f "$RUN/wedlm-simple/final/config.json" ] || stage export-cont $PY -m wedlm.train.export "$RUN/wedlm-cont/final" "$OUT"
fi
if [ "${V4:-0}" = 1 ]; then
  [ -f data/stop2/simple_stop.jsonl ] || stage data-simple $PY -m wedlm.data.curriculum --out data/stop2 --simple-stop 200000
  stage wedlm-simple $PY -m wedlm.cli.main train --config configs/tiny_wedlm_simple.yaml
  mix_stage wedlm-mix configs/tiny_wedlm_mix.yaml data/widen/v4mix.jsonl \
    '{"seed": 5, "simple": {"6": 30000, "15": 10000}, "short": {"20": 10000}, "replay": {"count": 5000, "addsub": 25000, "listops": 25000}}'
  mix_stage wedlm-forms configs/tiny_wedlm_forms.yaml data/widen/v7mix.jsonl \
    '{"seed": 8, "simple": {"6": 20000, "15": 10000}, "simple_forms": {"6": 20000}, "short": {"20": 10000}, "replay": {"count": 5000, "addsub": 30000, "listops": 30000}}'
  [ "${V5:-0}" = 1 ] || stage export-v4 $PY -m wedlm.train.export "$RUN/wedlm-forms/final" "$OUT"
fi
if [ "${V5:-0}" = 1 ]; then
  [ -f data/widen/tens10.jsonl ] || stage data-tens10 $PY -c "from pathlib import Path; from wedlm.data import curriculum as c; \
c.write_jsonl(Path('data/widen/tens10.jsonl'), [c.to_chat(e) for e in c.tens_count_examples(45000, 'probe-step10-long')])"
  stage wedlm-tens10 $PY -m wedlm.cli.main train --config configs/tiny_wedlm_tens10.yaml
  mix_stage wedlm-tens configs/tiny_wedlm_tens.yaml data/widen/v10mix.jsonl \
    '{"seed": 11, "distractor": {"30": 22000}, "simple_forms": {"6": 8000}, "replay": {"count": 6000, "addsub": 25000, "listops": 20000}}'
  mix_stage wedlm-tens2 configs/tiny_wedlm_tens2.yaml data/widen/v11mix.jsonl \
    '{"seed": 12, "distractor": {"30": 32000}, "replay": {"count": 3000, "addsub": 6000, "listops": 7000}}'
  mix_stage wedlm-tens3 configs/tiny_wedlm_tens3.yaml data/widen/v12mix.jsonl \
    '{"seed": 13, "distractor": {"30": 24000}, "simple_forms": {"6": 6000}, "replay": {"count": 6000, "addsub": 6000, "listops": 8000}}'
  [ "${V6:-0}" = 1 ] || stage export-v5 $PY -m wedlm.train.export "$RUN/wedlm-tens3/final" "$OUT"
fi
if [ "${V6:-0}" = 1 ]; then
  mix_stage wedlm-tens5 configs/tiny_wedlm_tens5.yaml data/widen/v14mix.jsonl \
    '{"seed": 15, "distractor": {"30": 12000}, "simple_forms": {"6": 4000}, "replay": {"count": 4000, "addsub": 15000, "listops": 10000}}'
  mix_stage wedlm-tens6 configs/tiny_wedlm_tens6.yaml data/widen/v15mix.jsonl \
    '{"seed": 16, "distractor": {"30": 14000}, "simple_forms": {"6": 6000}, "replay": {"count": 5000, "addsub": 15000, "listops": 10000}}'
  mix_stage wedlm-tens7 configs/tiny_wedlm_tens7.yaml data/widen/v16mix.jsonl \
    '{"seed": 17, "distractor": {"30": 12000}, "simple_forms": {"6": 10000}, "replay": {"count": 5000, "addsub": 12000, "listops": 10000}}'
  [ "${V7:-0}" = 1 ] || stage export-v6 $PY -m wedlm.train.export "$RUN/wedlm-tens7/final" "$OUT"
fi
# the mix of every 8-layer stage after its "seed" (each stage reads unseen records: a new seed)
MIX='"distractor": {"30": 12000}, "simple_forms": {"6": 10000}, "replay": {"count": 5000, "addsub": 12000, "listops": 10000}}'
if [ "${V7:-0}" = 1 ]; then
  [ -f "$RUN/grow8/model.safetensors" ] || stage grow $PY -m wedlm.train.grow "$RUN/wedlm-tens7/final" "$RUN/grow8"
  mix_stage wedlm-deep configs/tiny_wedlm_deep.yaml data/widen/v17mix.jsonl "{\"seed\": 18, $MIX"
  mix_stage wedlm-deep2 configs/tiny_wedlm_deep2.yaml data/widen/v18mix.jsonl "{\"seed\": 19, $MIX"
  [ "${V8:-0}" = 1 ] || stage export-v7 $PY -m wedlm.train.export "$RUN/wedlm-deep2/final" "$OUT"
fi
if [ "${V8:-0}" = 1 ]; then
  mix_stage wedlm-deep3 configs/tiny_wedlm_deep3.yaml data/widen/v19mix.jsonl "{\"seed\": 20, $MIX"
  mix_stage wedlm-deep4 configs/tiny_wedlm_deep4.yaml data/widen/v20mix.jsonl "{\"seed\": 21, $MIX"
  mix_stage wedlm-deep5 configs/tiny_wedlm_deep5.yaml data/widen/v21mix.jsonl "{\"seed\": 22, $MIX"
  # with V9=1 too, until wedlm-deep11 has trained: its config inits from the exported version 8
  { [ "${V9:-0}" = 1 ] && [ -f "$RUN/wedlm-deep11/final/config.json" ]; } ||
    stage export-v8 $PY -m wedlm.train.export "$RUN/wedlm-deep5/final" "$OUT"
fi
if [ "${V9:-0}" = 1 ]; then  # own mixes, not $MIX: two-digit distractor ranges (distractor2), carry sums (carry)
  mix_stage wedlm-deep11 configs/tiny_wedlm_deep11.yaml data/widen/v27mix.jsonl \
    '{"seed": 28, "distractor": {"30": 12000}, "distractor2": {"50": 5000}, "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
  mix_stage wedlm-deep12 configs/tiny_wedlm_deep12.yaml data/widen/v28mix.jsonl \
    '{"seed": 29, "distractor": {"30": 12000}, "distractor2": {"50": 5000}, "carry": {"20": 8000}, "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
  [ "${V10:-0}" = 1 ] || stage export-v9 $PY -m wedlm.train.export "$RUN/wedlm-deep12/final" "$OUT"
fi
if [ "${V10:-0}" = 1 ]; then
  mix_stage wedlm-deep13 configs/tiny_wedlm_deep13.yaml data/widen/v29mix.jsonl \
    '{"seed": 30, "distractor": {"30": 16000}, "distractor2": {"50": 8000}, "carry": {"20": 12000}, "simple_forms": {"6": 10000}, "replay": {"count": 12000, "addsub": 20000, "listops": 10000}}'
  mix_stage wedlm-deep14 configs/tiny_wedlm_deep14.yaml data/widen/v30mix.jsonl \
    '{"seed": 31, "distractor": {"30": 12000}, "distractor2": {"50": 8000}, "carry": {"20": 8000}, "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
  [ "${V11:-0}" = 1 ] || stage export-v10 $PY -m wedlm.train.export "$RUN/wedlm-deep14/final" "$OUT"
fi
if [ "${TRIAL_EDGE:-0}" = 1 ]; then  # range endpoints (edge): starts near 0, ends near 10/100/1000
  mix_stage wedlm-deep15 configs/tiny_wedlm_deep15.yaml data/widen/v31mix.jsonl \
    '{"seed": 32, "edge": {"40": 16000}, "distractor": {"30": 10000}, "distractor2": {"50": 8000}, "carry": {"20": 8000}, "simple_forms": {"6": 8000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
  [ -f "$RUN/trial-edge/config.json" ] || stage export-trial-edge $PY -m wedlm.train.export "$RUN/wedlm-deep15/final" "$RUN/trial-edge"
fi
if [ "${V11:-0}" = 1 ]; then  # random block offsets, version 10's mix freshly drawn
  mix_stage wedlm-deep17 configs/tiny_wedlm_deep17.yaml data/widen/v33mix.jsonl \
    '{"seed": 33, "distractor": {"30": 12000}, "distractor2": {"50": 8000}, "carry": {"20": 8000}, "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
  stage export-v11 $PY -m wedlm.train.export "$RUN/wedlm-deep17/final" "$OUT"
fi
echo "=== recipe done: $OUT"
