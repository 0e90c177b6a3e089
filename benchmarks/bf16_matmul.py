"""bf16 matmuls of a model's shapes on this CPU: the engine's `few_rows_mm` on bf16 column panels
(`fast_model.bf16_panel_linear`'s kernel) against `F.linear` under bf16 autocast on the bf16
weight (oneDNN: what the engine ran before) and against `few_rows_mm` on float32 panels, side by
side in one process, at several row counts.

    python benchmarks/bf16_matmul.py [--model DIR] [--rows 1,2,4,8,16,32] [--passes 5]

Every layer gets its own random weights of the model's shapes (fused q/k/v, o_proj, fused gate/up,
down_proj, and lm_head), so a pass over all of them reads the weights from memory as a decode step
does. Prints, per row count, milliseconds per pass (the least of `--passes` after one warm-up
pass; one torch thread) and the share of the first layer's outputs that equal oneDNN's bit for
bit (the rest lie a bf16 unit or so apart: other summation orders). This is what `fast_model.BF16_AMX_FEW_ROWS_MAX` was decided
from (docs/engine.md, "bf16 matmuls on bf16 panels"). Needs a CPU with AVX512-BF16 and the
engine's C++ operators; `--model` defaults to scripts/fetch_smollm2.py's SmolLM2 folder.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from wedlm.engine.fast_model import bf16_panels_supported, pack_panels, use_native_ops


def shapes(config: dict) -> list[tuple[int, int]]:
    """(out_features, in_features) of every matmul of the model, layer after layer, then lm_head."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    dim = config.get("head_dim") or h // heads
    q, kv = heads * dim, config.get("num_key_value_heads", heads) * dim
    return [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)] * layers + [(config["vocab_size"], h)]


def sweep(fn, passes: int) -> float:
    """Least milliseconds of `passes` calls of fn after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def main() -> None:
    from wedlm.model.source import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(cache_dir() / "smollm2" / "SmolLM2-135M-Instruct"),
                    help="folder with config.json")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--passes", type=int, default=5)
    a = ap.parse_args()
    if not (use_native_ops() and bf16_panels_supported()):
        raise SystemExit("bf16_matmul: needs a CPU with AVX512-BF16 and the engine's C++ operators")
    torch.set_num_threads(1)
    mats = shapes(json.loads((Path(a.model) / "config.json").read_text()))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for n, k in mats]
    f32_panels = [pack_panels(w) for w in weights]
    bf16 = [w.bfloat16() for w in weights]
    bf16_panels = [pack_panels(w) for w in bf16]
    del weights
    mm = torch.ops.wedlm_cpu.few_rows_mm
    print("| rows | bf16 panels (ms) | oneDNN bf16 (ms) | float32 panels (ms) | outputs equal to oneDNN's (layer 0) |")
    print("|---|---|---|---|---|")
    for rows in [int(r) for r in a.rows.split(",")]:
        xs = {k: torch.randn(rows, k, generator=gen) for k in {k for _, k in mats}}
        x16 = {k: x.bfloat16() for k, x in xs.items()}
        ours = sweep(lambda x16=x16: [mm(x16[k], p, n, None) for (n, k), p in zip(mats, bf16_panels)], a.passes)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            onednn = sweep(lambda xs=xs: [F.linear(xs[k], w) for (_, k), w in zip(mats, bf16)], a.passes)
            want = [F.linear(xs[k], w) for (_, k), w in zip(mats[:4], bf16[:4])]
        f32 = sweep(lambda xs=xs: [mm(xs[k], p, n, None) for (n, k), p in zip(mats, f32_panels)], a.passes)
        got = [mm(x16[k], p, n, None) for (n, k), p in zip(mats[:4], bf16_panels[:4])]
        same = sum(int((g == w).sum()) for g, w in zip(got, want)) / sum(w.numel() for w in want)
        print(f"| {rows} | {ours:.1f} | {onednn:.1f} | {f32:.1f} | {100 * same:.2f}% |")


if __name__ == "__main__":
    main()
