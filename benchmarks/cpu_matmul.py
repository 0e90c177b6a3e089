"""Float32 matmuls of a model's shapes on this CPU: BLAS (`F.linear`, MKL in torch's CPU build)
against oneDNN (`torch.ops.mkldnn._linear_pointwise`) on the weight as it is and on the weight
prepacked in oneDNN's blocked layout (`wedlm.engine.fast_model.pack_weight`, what the engine's
`onednn_linear` calls), side by side in one process, at several row counts.

    python benchmarks/cpu_matmul.py [--model models/wedlm-tiny] [--rows 1,2,8,16,32,544] [--repeats 200]

For each (rows, weight) of the model's matmuls (fused q/k/v, o_proj, fused gate/up, down_proj,
lm_head) the three run alternately, `--repeats` calls each after a warm-up, one torch thread;
prints the median microseconds per call, the speed-ups over BLAS, the largest difference of the
results (float32 summation order) and, per row count, the sum over one layer's matmuls plus
lm_head, and over all layers + lm_head by BLAS and by the oneDNN rule (prepacked oneDNN where
rows >= 2 and rows x weight size >= `fast_model.PACKED_MIN_MACS`, else BLAS). This is what `hardware.cpu_prefers_onednn_linear`, `fast_model.ONEDNN_MIN_ROWS` and
`fast_model.PACKED_MIN_MACS` were decided from (docs/engine.md, "oneDNN matmuls" and
"Prepacked oneDNN weights").

Then, where the engine's C++ operators build (`fast_model.use_native_ops`), the prepacked oneDNN
matmul against `wedlm_cpu::few_rows_mm` on the weight's column panels (`fast_model.pack_panels`,
what compiled graphs run for 2 to `fast_model.FEW_ROWS_MAX` rows): per matmul with each weight hot
in cache, whether the two results are equal bit for bit, and the whole model's matmuls (every
layer its own weights, so they come from memory as in a step; median of `--repeats` // 10 passes).
This is what `fast_model.FEW_ROWS_MAX` was decided from (docs/engine.md, "Few-row matmuls on
column panels").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from wedlm.engine.fast_model import PACKED_MIN_MACS, pack_panels, pack_weight, use_native_ops


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
    packed = {name: pack_weight(w)[0] for name, w in weights.items()}
    print("| rows | matmul | BLAS us | oneDNN us | prepacked us | speed-up | prepacked speed-up | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    totals = []
    for rows in (int(r) for r in a.rows.split(",")):
        sums = [0.0, 0.0, 0.0]
        model = [0.0, 0.0]  # the whole model: BLAS, the engine's rule
        for name, w in weights.items():
            x, wp = torch.randn(rows, w.shape[1], generator=gen), packed[name]
            times = median_us([lambda x=x, w=w: F.linear(x, w),
                               lambda x=x, w=w: _onednn(x, w),
                               lambda x=x, wp=wp: _onednn(x, wp)],
                              a.repeats)
            want = F.linear(x, w)
            diff = max((want - _onednn(x, u)).abs().max().item()
                       for u in (w, wp))
            sums = [s + t for s, t in zip(sums, times)]
            blas, dnn, pre = times
            count = 1 if name == "lm_head" else config["num_hidden_layers"]
            engine = pre if rows >= 2 and rows * w.numel() >= PACKED_MIN_MACS else blas
            model = [model[0] + count * blas, model[1] + count * engine]
            print(f"| {rows} | {name} [{w.shape[0]}x{w.shape[1]}] | {blas:.1f} | {dnn:.1f} | {pre:.1f} "
                  f"| {blas / dnn:.2f}x | {blas / pre:.2f}x | {diff:.1e} |")
        totals.append((rows, *sums, *model))
    print("\n| rows | one layer + lm_head, BLAS us | oneDNN us | prepacked us | speed-up | prepacked speed-up "
          "| all layers + lm_head, BLAS us | the oneDNN rule us | speed-up |\n|---|---|---|---|---|---|---|---|---|")
    for rows, b, d, p, mb, me in totals:
        print(f"| {rows} | {b:.1f} | {d:.1f} | {p:.1f} | {b / d:.2f}x | {b / p:.2f}x | {mb:.0f} | {me:.0f} "
              f"| {mb / me:.2f}x |")
    if use_native_ops():
        panels_tables(config, [int(r) for r in a.rows.split(",") if int(r) >= 2], a.repeats, gen)


def _onednn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T by oneDNN, weight as it is or prepacked (`pack_weight`)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def panels_tables(config: dict, rows_list: list[int], repeats: int, gen: torch.Generator) -> None:
    """Prepacked oneDNN against `few_rows_mm` on column panels: per matmul (hot), then the whole
    model's matmuls with every layer's own weights."""
    mm = torch.ops.wedlm_cpu.few_rows_mm
    model = [(name, torch.randn(n, k, generator=gen)) for name, n, k in shapes(config)
             for _ in range(1 if name == "lm_head" else config["num_hidden_layers"])]
    model = [(name, w, pack_weight(w)[0], pack_panels(w)) for name, w in model]
    print("\n| rows | matmul | prepacked oneDNN us | few_rows_mm us | speed-up | GFLOP/s | equal |\n|---|---|---|---|---|---|---|")
    whole = []
    for rows in rows_list:
        seen = set()
        for name, w, packed, panels in model:
            if name in seen:
                continue
            seen.add(name)
            x, n = torch.randn(rows, w.shape[1], generator=gen), w.shape[0]
            dnn, few = median_us([lambda x=x, p=packed: _onednn(x, p), lambda x=x, p=panels, n=n: mm(x, p, n, None)],
                                 repeats)
            equal = torch.equal(_onednn(x, packed), mm(x, panels, n, None))
            print(f"| {rows} | {name} [{n}x{w.shape[1]}] | {dnn:.1f} | {few:.1f} | {dnn / few:.2f}x "
                  f"| {2 * rows * w.numel() / few / 1e3:.0f} | {equal} |")
        xs = {name: torch.randn(rows, w.shape[1], generator=gen) for name, w, _, _ in model}
        dnn, few = median_us([lambda xs=xs: [_onednn(xs[name], p) for name, _, p, _ in model],
                              lambda xs=xs: [mm(xs[name], p, w.shape[0], None) for name, w, _, p in model]],
                             max(repeats // 10, 5))
        whole.append((rows, dnn, few))
    print("\n| rows | all layers + lm_head, prepacked oneDNN us | few_rows_mm us | speed-up |\n|---|---|---|---|")
    for rows, dnn, few in whole:
        print(f"| {rows} | {dnn:.0f} | {few:.0f} | {dnn / few:.2f}x |")


if __name__ == "__main__":
    main()
