#!/usr/bin/env bash
# GPU check of the engine, usable as-is on any machine with CUDA:
#   1. the `gpu`-marked tests (compiled forward with CUDA graphs vs eager on CUDA; the
#      tensor-parallel N=2 equality test, tests/engine/test_tensor_parallel_gpu.py, when
#      2 GPUs are visible: it skips itself otherwise);
#   2. a random-weight WeDLM-8B-shaped checkpoint reduced in depth (wedlm.testing.WEDLM_8B,
#      LAYERS layers; written once, reused when present);
#   3. `wedlm bench --quick` on it on CUDA in bf16 with the compiled forward (--no-enforce-eager);
#   4. `wedlm bench --slot-cost --quick` on it (eager and compiled).
# Everything goes into OUT (default out/gpu_check): logs, junit XML, bench JSON/markdown/plots,
# versions and nvidia-smi. Exits 2 at once without CUDA; 1 when any step failed.
#
# Usage: scripts/gpu_check.sh [OUT]     env: LAYERS (default 4), PYTHON (default python)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-out/gpu_check}"
PY="${PYTHON:-python}"
LAYERS="${LAYERS:-4}"

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device (torch.cuda.is_available() is False for $PY); this check needs a GPU" >&2
    exit 2
fi
mkdir -p "$OUT"
status=0
step() {  # step NAME CMD...: run, log to OUT/NAME.log, record the exit status
    local name="$1"; shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "$name $rc" >> "$OUT/status.txt"
    [ "$rc" = 0 ] || status=1
}
: > "$OUT/status.txt"
"$PY" - > "$OUT/versions.txt" <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i}", torch.cuda.get_device_name(i))
PYEOF
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
cat "$OUT/versions.txt"

# only the GPU test files (tests/**/test_*_gpu.py): collecting the whole suite would import the
# server's and evaluation's optional packages, which a bare GPU image may lack
mapfile -t GPU_TESTS < <(find tests -name 'test_*_gpu.py' | sort)
step gpu_tests "$PY" -m pytest -q -m gpu "${GPU_TESTS[@]}" --junitxml "$OUT/gpu_tests.xml"

MODEL="$OUT/wedlm-8b-shape-${LAYERS}l"
if [ ! -f "$MODEL/config.json" ]; then
    step make_model "$PY" -c "
import sys
from wedlm.testing import WEDLM_8B, make_hf_checkpoint
make_hf_checkpoint(sys.argv[1], family='qwen3', wedlm=True, tokenizer=True, init_std=0.02,
                   **{**WEDLM_8B, 'num_hidden_layers': int(sys.argv[2])})
print('wrote', sys.argv[1])" "$MODEL" "$LAYERS"
fi

step bench "$PY" -m wedlm.cli.main bench --quick --model "$MODEL" --device cuda --dtype bfloat16 \
    --no-enforce-eager --out-dir "$OUT/bench"
step slot_cost "$PY" -m wedlm.cli.main bench --slot-cost --quick --model "$MODEL" --device cuda \
    --dtype bfloat16 --out-dir "$OUT/slot_cost"

echo "== results in $OUT (per-step exit status in $OUT/status.txt)"
cat "$OUT/status.txt"
exit $status
