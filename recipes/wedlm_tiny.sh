#!/usr/bin/env bash
# End-to-end recipe of the shipped tiny WeDLM (models/wedlm-tiny), the paper's pipeline at toy scale:
#   1. data + byte-level BPE tokenizer   (python -m wedlm.data.build; skipped when present)
#   2. AR pretraining                     (configs/tiny_ar.yaml)
#   3. AR -> WeDLM conversion             (wedlm convert)
#   4. WeDLM continued training           (configs/tiny_wedlm.yaml: dual-stream masking + AR loss)
#   5. chat SFT                           (configs/tiny_sft.yaml)
#   6. export config.json + model.safetensors + generation_config.json into models/wedlm-tiny
# Resumable: rerun the same command; finished stages are skipped (their final/ exists) and
# an interrupted stage continues from its last checkpoint. Wall-clock per stage goes to
# runs/wedlm-tiny/stages.jsonl.
#
#   nohup bash recipes/wedlm_tiny.sh > runs/wedlm-tiny/recipe.log 2>&1 &
# Then evaluate and write the model card (OMP_NUM_THREADS=1 matters on a shared machine):
#   OMP_NUM_THREADS=1 python recipes/eval_wedlm_tiny.py --model models/wedlm-tiny --out runs/wedlm-tiny/eval --limit 30
#   OMP_NUM_THREADS=1 python recipes/tune_decoding.py   # optional: W / tau / lambda grid
#   python recipes/model_card.py --notes runs/wedlm-tiny/card_notes.md
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/wedlm-tiny
OUT=models/wedlm-tiny
mkdir -p "$RUN"
PY=${PYTHON:-python}

stage() {  # stage NAME COMMAND...: run, timing it into stages.jsonl
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== [$(date +%T)] stage $name: $*"
  "$@"
  local t1=$(date +%s)
  echo "{\"stage\": \"$name\", \"seconds\": $((t1 - t0)), \"finished\": \"$(date -Is)\"}" >> "$RUN/stages.jsonl"
  echo "=== [$(date +%T)] stage $name done in $((t1 - t0)) s"
}

if [ ! -f data/pretrain.jsonl ] || [ ! -f data/sft.jsonl ] || [ ! -f "$OUT/tokenizer.json" ]; then
  stage data $PY -m wedlm.data.build --out data --tokenizer-out "$OUT"
fi
stage ar      $PY -m wedlm.cli.main train --config configs/tiny_ar.yaml
[ -f "$RUN/ar-wedlm/config.json" ] || stage convert $PY -m wedlm.cli.main convert "$RUN/ar/final" "$RUN/ar-wedlm"
stage wedlm   $PY -m wedlm.cli.main train --config configs/tiny_wedlm.yaml
stage sft     $PY -m wedlm.cli.main train --config configs/tiny_sft.yaml
stage export  $PY -m wedlm.train.export "$RUN/sft/final" "$OUT"
echo "=== recipe done: $OUT"
