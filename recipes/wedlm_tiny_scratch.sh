#!/usr/bin/env bash
# The shipped tiny WeDLM's lessons applied from scratch in one budget of about 110 minutes on a
# quiet 2-core CPU (session 22's trial of issue 9's "recipe from scratch in 120 minutes"; the
# shipped weights come from the longer lineage of recipes/wedlm_tiny.sh):
#   1. data: two freshly drawn curriculum mixes (train split only)
#   2. AR from scratch, 8 layers x 192, short ranges + every task, stop weighted 20x
#      (configs/scratch_ar.yaml, 25 min)
#   3. AR -> WeDLM conversion (wedlm convert: adds the [MASK] token)
#   4. WeDLM training with every option the lineage kept (configs/scratch_wedlm.yaml, 80 min)
#   5. export to runs/wedlm-tiny-scratch/export (models/wedlm-tiny is left alone)
# Resumable like recipes/wedlm_tiny.sh; the run owns both cores.
#   mkdir -p runs/wedlm-tiny-scratch && nohup bash recipes/wedlm_tiny_scratch.sh > runs/wedlm-tiny-scratch/recipe.log 2>&1 &
# Then evaluate the export on the test split at the shipped model's decoding defaults:
#   python recipes/eval_wedlm_tiny.py --model runs/wedlm-tiny-scratch/export --out runs/wedlm-tiny-scratch/eval
# SCRATCH=2 runs the second trial instead (sessions 27-29): a 4-layer model with one-row steps at
# a peak of 5e-4, AR 30 minutes (configs/scratch2_ar.yaml) and WeDLM 85 minutes
# (configs/scratch2_wedlm.yaml), into runs/wedlm-tiny-scratch2 (docs/training.md, "From scratch in
# two hours: a second trial").
set -euo pipefail
cd "$(dirname "$0")/.."
V=${SCRATCH:-1}
case "$V" in
  1) RUN=runs/wedlm-tiny-scratch; AR=configs/scratch_ar.yaml; WD=configs/scratch_wedlm.yaml ;;
  2) RUN=runs/wedlm-tiny-scratch2; AR=configs/scratch2_ar.yaml; WD=configs/scratch2_wedlm.yaml ;;
  *) echo "SCRATCH must be 1 or 2, got $V" >&2; exit 2 ;;
esac
mkdir -p "$RUN" data/scratch
PY=${PYTHON:-python}

source recipes/stages.sh  # stage, mix_stage

mix_stage ar "$AR" data/scratch/s1.jsonl \
  '{"seed": 40, "simple": {"6": 40000}, "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 20000, "listops": 20000}}'
[ -f "$RUN/ar-wedlm/config.json" ] || stage convert $PY -m wedlm.cli.main convert "$RUN/ar/final" "$RUN/ar-wedlm"
mix_stage wedlm "$WD" data/scratch/s2.jsonl \
  '{"seed": 41, "distractor": {"30": 12000}, "distractor2": {"50": 8000}, "carry": {"20": 8000}, "simple_forms": {"6": 10000}, "replay": {"count": 8000, "addsub": 12000, "listops": 10000}}'
[ -f "$RUN/export/config.json" ] || stage export $PY -m wedlm.train.export "$RUN/wedlm/final" "$RUN/export"
cp models/wedlm-tiny/{generation_config,tokenizer,tokenizer_config,special_tokens_map}.json "$RUN/export/"  # the shipped decoding defaults and the tokenizer it trained with
echo "=== recipe done: $RUN/export"
