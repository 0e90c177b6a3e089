#!/usr/bin/env bash
# Two trial stages on top of the shipped weights: "Count from A to N." with small starts and any end,
# the demo range 1..200 at its natural rate, every other task replayed (configs/tiny_wedlm_from_one.yaml,
# 50 minutes annealed on the clock), then small-start ranges ending in 100..320, where only N's
# hundreds digit decides the stop (configs/tiny_wedlm_hundreds.yaml, 75 minutes on one thread, then
# 52 more minutes on fresh draws). It
# exports to runs/wedlm-tiny-from-one/export and evaluates there; models/wedlm-tiny is left alone
# (the trials did not reach their target: docs/experiments.md).
#
#   mkdir -p runs/wedlm-tiny-from-one && nohup bash recipes/wedlm_tiny_from_one.sh > runs/wedlm-tiny-from-one/recipe.log 2>&1 &
#
# Resumable like recipes/wedlm_tiny.sh (DRY_RUN=1 prints the plan); the first stage owns both cores.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/wedlm-tiny-from-one
OUT=$RUN/export
PY=${PYTHON:-python}
mkdir -p "$RUN"
source recipes/stages.sh  # stage, mix, train, export_model

mix data/widen/from-one-mix.jsonl '{"seed": 34, "from_small": {"320": 14000}, "distractor": {"30": 6000},
  "distractor2": {"50": 6000}, "carry": {"20": 6000}, "simple_forms": {"6": 6000},
  "replay": {"count": 5000, "addsub": 12000, "listops": 10000}, "replay_demo": 0.0}'
train configs/tiny_wedlm_from_one.yaml
mix data/widen/hundreds-mix.jsonl '{"seed": 35, "from_small": {"100-320": 12000, "320": 4000}, "distractor2": {"50": 4000},
  "carry": {"20": 4000}, "simple_forms": {"6": 4000}, "replay": {"count": 4000, "addsub": 10000, "listops": 8000},
  "replay_demo": 0.0}'
train configs/tiny_wedlm_hundreds.yaml
# the same stage continued on fresh draws, on both cores
mix data/widen/hundreds2-mix.jsonl '{"seed": 36, "from_small": {"100-320": 12000, "320": 4000}, "distractor2": {"50": 4000},
  "carry": {"20": 4000}, "simple_forms": {"6": 4000}, "replay": {"count": 4000, "addsub": 10000, "listops": 8000},
  "replay_demo": 0.0}'
train configs/tiny_wedlm_hundreds.yaml init=$RUN/hundreds/final out_dir=$RUN/hundreds2 \
  data=data/widen/hundreds2-mix.jsonl num_threads=2 max_minutes=52 lr=1.5e-4
# every task at the shipped lineage's rates (counting replay at its highest), small starts kept, at a
# low learning rate: the hundreds stages read N but lose some counting from other starts
mix data/widen/replay-mix.jsonl '{"seed": 37, "from_small": {"100-320": 5000, "320": 3000}, "distractor": {"30": 10000},
  "distractor2": {"50": 6000}, "carry": {"20": 6000}, "simple_forms": {"6": 8000},
  "replay": {"count": 10000, "addsub": 10000, "listops": 10000}, "replay_demo": 0.0}'
train configs/tiny_wedlm_hundreds.yaml init=$RUN/hundreds2/final out_dir=$RUN/replay seed=43 \
  data=data/widen/replay-mix.jsonl max_minutes=70 lr=1.0e-4
export_model "$RUN/replay/final" "$OUT"
# the shipped decoding defaults and tokenizer
stage copy-defaults cp models/wedlm-tiny/{generation_config,tokenizer,tokenizer_config,special_tokens_map}.json "$OUT/"
stage eval $PY recipes/eval_wedlm_tiny.py --model "$OUT" --out "$RUN/eval" \
  --n-count 200 --n-addsub 100 --n-listops 150 --probe-items 20 --skip probe,end
echo "=== recipe done: $OUT"
