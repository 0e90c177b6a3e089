#!/usr/bin/env bash
# Training quick start: from a fresh clone, a small curriculum, a few hundred WeDLM training
# steps from the shipped model into runs/quickstart, and a generation with the result.
# About 5 minutes on 2 CPU cores. STEPS=N sets the number of steps (default 300), DATA=DIR and
# OUT=DIR the curriculum and run folders.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
STEPS=${STEPS:-300}
OUT=${OUT:-runs/quickstart}
DATA=${DATA:-data/quickstart}

[ -f "$DATA/train.jsonl" ] || $PY -m wedlm.data.curriculum --out "$DATA" --scale 0.01
# resumes when $OUT already holds a run (a finished one returns at once)
$PY -m wedlm.cli.main train --config configs/quickstart.yaml --set max_steps="$STEPS" --set out_dir="$OUT" \
  --set data="$DATA/train.jsonl" --set save_every="$STEPS"
FINAL="$OUT/final"
$PY -m wedlm.cli.main generate --model "$FINAL" --chat "Count from 1 to 20." --temperature 0
echo "trained checkpoint: $FINAL (try: wedlm chat --model $FINAL)"
