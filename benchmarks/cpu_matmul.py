"""Float32 matmuls of a model's shapes on this CPU: BLAS (`F.linear`, MKL in torch's CPU build)
against oneDNN (`torch.ops.mkldnn._linear_pointwise`, what `wedlm.engine.fast_model.onednn_linear`
calls), side by side in one process, at several row counts.

    python benchmarks/cpu_matmul.py [--model models/wedlm-tiny] [--rows 1,2,8,16,32,544] [--repeats 200]

For each (rows, weight) of the model's matmuls (fused q/k/v, o_proj, fused gate/up, down_proj,
lm_head) both kernels run alternately, `--repeats` calls each after a warm-up, one torch thread;
prints the median microseconds per call, the oneDNN speed-up, the largest difference of the
results (float32 summation order) and, per row count, the sum over one layer's matmuls plus
lm_head. This is what `hardware.cpu_prefers_onednn_linear` and `fast_model.ONEDNN_MIN_ROWS`
were decided from (docs/engine.md, "oneDNN matmuls").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def shapes(config: dict) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of one layer's matmuls and lm_head, as the engine fuses them."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return [("qkv", q + 2 * kv, h), ("o_proj", h, q), ("gate_up", 2 * i, h), ("down_proj", h, i), ("lm_head", v, h)]


def median_us(fns: list, repeats: int) -> list[float]:
    """Median microseconds per call of each function, called alternately `repeats` times."""
    for fn in fns:
        for _ in range(20):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return [1e6 * statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/wedlm-tiny", help="folder with config.json")
    ap.add_argument("--rows", default="1,2,4,8,16,17,32,64,544")
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    config = json.loads((Path(a.model) / "config.json").read_text())
    gen = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(n, k, generator=gen) for name, n, k in shapes(config)}
    print("| rows | matmul | BLAS us | oneDNN us | speed-up | max abs diff |")
    print("|---|---|---|---|---|---|")
    totals = []
    for rows in (int(r) for r in a.rows.split(",")):
        blas_sum = dnn_sum = 0.0
        for name, w in weights.items():
            x = torch.randn(rows, w.shape[1], generator=gen)
            blas, dnn = median_us([lambda: F.linear(x, w),
                                   lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")], a.repeats)
            diff = (F.linear(x, w) - torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")).abs().max()
            blas_sum, dnn_sum = blas_sum + blas, dnn_sum + dnn
            print(f"| {rows} | {name} [{w.shape[0]}x{w.shape[1]}] | {blas:.1f} | {dnn:.1f} | {blas / dnn:.2f}x "
                  f"| {diff.item():.1e} |")
        totals.append((rows, blas_sum, dnn_sum))
    print("\n| rows | one layer + lm_head, BLAS us | oneDNN us | speed-up |\n|---|---|---|---|")
    for rows, b, d in totals:
        print(f"| {rows} | {b:.1f} | {d:.1f} | {b / d:.2f}x |")


if __name__ == "__main__":
    main()
