#!/usr/bin/env bash
# The engine-speed measurements (docs/engine.md, "Speed measurements") in one sitting, one
# torch thread each, in this order; run it on a quiet machine (nothing else on the cores):
#   OUT/slot_cost.md|json, OUT/img/bench_slot_cost.png  one forward with W = 1..64 slots over a
#        512-token cached prefix: shipped model, random 29M and 158M Qwen3 shapes, eager + compiled
#   OUT/eager/ and OUT/compiled/                        `wedlm bench` (counting, arithmetic,
#        listops; batch 1, 8 and 32; wedlm and blockwise at the default tau, verified, ar and
#        transformers generate side by side) per forward path
#   OUT/step_profile.txt                                 where a step's time goes: BEFORE (an older
#        commit, exported with git archive), this tree, this tree compiled; batch 1 and 8
#   OUT/cpu_matmul.md                                    float32 matmuls of the shipped model's
#        shapes, BLAS against oneDNN (what the engine's automatic matmul kernel was chosen from)
#   OUT/times.txt                                        wall clock of each part
#   OUT/speed_tables.md                                  engine vs transformers per task and
#        batch, eager and compiled (benchmarks/speed_tables.py)
# Usage: bash scripts/cpu_speed.sh OUT [BEFORE_COMMIT] [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/cpu_speed.sh OUT [BEFORE_COMMIT] [REPEATS]}
BEFORE=${2:-56498e3}
REPEATS=${3:-10}
PY=${PYTHON:-python}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1

part() {  # part NAME COMMAND...: run and log its wall clock
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== [$(date +%T)] $name: $*"
  "$@"
  echo "$name $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
}

part cpu-matmul sh -c "$PY benchmarks/cpu_matmul.py > '$OUT/cpu_matmul.md'"
part slot-cost $PY -m wedlm.cli.main bench --slot-cost --threads 1 --repeats "$REPEATS" --out-dir "$OUT"
for mode in eager compiled; do
  flag=--enforce-eager; [ $mode = compiled ] && flag=--no-enforce-eager
  part "bench-$mode" $PY -m wedlm.cli.main bench --threads 1 --repeats 1 --batch-sizes 1,8,32 \
    --taus 0.4 --lambdas 0.02 --blockwise-taus 0.4 --tasks counting,arithmetic,listops $flag \
    --out-dir "$OUT/$mode"
done
before=$(mktemp -d)
git archive "$BEFORE" wedlm | tar -x -C "$before"
part step-profile sh -c "$PY benchmarks/step_profile.py --trees $before+eager,.+eager,.+compiled --batch 1 --batch 8 \
  > '$OUT/step_profile.txt'"
rm -rf "$before"
$PY benchmarks/speed_tables.py "$OUT" > "$OUT/speed_tables.md"
echo "=== [$(date +%T)] done: $OUT"
