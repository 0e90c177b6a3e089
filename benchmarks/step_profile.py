"""Where a decode step's time goes: cProfile of `Engine.step` on the shipped model.

Runs greedy decoding (`--decoding`, default wedlm) of `--batch` prompts for `--max-tokens`
tokens on one thread, under cProfile, and prints the cumulative time per step of each
part of the step (and, measured first without the profiler, the plain wall time of a
step: the least and the median over `--wall-runs` runs per repeat, every repeat pooled):
scheduling, window plans, forward items, metadata (`prepare`), the model forward, the rest
of `execute` (logits, argmax, split), decoder updates (entropy, fill), commit and
detokenization. `--trees A,B` runs the same profile in subprocesses
on other source trees (e.g. an exported older commit) and prints the tables side by side.

Below each table: the step's floor on this CPU. The runner's inputs of every timed step
(tokens fed, logit rows, keys each query reads) give the step's float32 FLOPs (every matmul,
attention's QK^T and PV) and bytes (the matmul weights once, the K/V rows read); a float32
matmul (the faster of torch's BLAS and the engine's `few_rows_mm`, one thread) and a read of a
buffer of the step's bytes (same thread count) measure this CPU's peak rates in the same process; the floor is the larger of
FLOPs / peak FLOP rate and bytes / read bandwidth, printed with the measured step as "x floor".

    python benchmarks/step_profile.py --batch 1 --batch 8
    python benchmarks/step_profile.py --trees .+eager,.+compiled --batch 1 --batch 8
    python benchmarks/step_profile.py --trees /tmp/before+compiled,.+compiled --batch 1 --batch 8
    python benchmarks/step_profile.py --trees /tmp/before+compiled,.+compiled --batch 1 --repeats 10 --wall-runs 10
    python benchmarks/step_profile.py --model M --device cuda --dtype bfloat16 --trees .,.+compiled --top 12
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

# (label, function names whose cumulative time is summed; only functions under wedlm/)
PARTS = [
    ("step total", ("step",), "engine.py"),
    ("schedule", ("schedule",), "scheduler.py"),
    ("decoder plan", ("plan",), "decoders/"),
    ("forward items", ("_forward_item",), "engine.py"),
    ("metadata (prepare)", ("prepare",), "runner.py"),
    ("execute (forward + logits)", ("execute",), "runner.py"),
    ("  model body (hidden_states)", ("hidden_states",), "model/qwen.py"),
    ("decoder update (entropy, fill)", ("update",), "decoders/"),
    ("commit", ("commit_tokens",), "commit.py"),
    ("deltas + detokenize", ("progress_delta", "final_delta"), "commit.py"),
]


def step_cost(config, tokens: int, rows: int, keys: int, kv_rows: int) -> tuple[int, int]:
    """(FLOPs, bytes) of one float32 forward of a model of `config` (a `ModelConfig`).

    Args:
        tokens: tokens fed; rows: logit rows; keys: (query, key) pairs summed over every fed
            token (a query at cache length c + i reads c + i + 1 keys); kv_rows: cache rows read,
            summed over the sequences.

    FLOPs: 2 x the multiply-adds of every matmul (q/k/v, o, gate/up, down, lm_head at `rows`) and
    of attention's QK^T and PV. Bytes: the matmul weights read once (lm_head counted even when
    tied) plus K and V of every layer at each cache row read.
    """
    h, i, v, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_layer = h * (q + 2 * kv) + q * h + h * 2 * i + i * h
    flops = 2 * (tokens * layers * per_layer + layers * 2 * keys * q + rows * h * v)
    return flops, 4 * (layers * per_layer + v * h) + 4 * 2 * layers * kv * kv_rows


def measure_peaks(nbytes: int, size: int = 512, seconds: float = 0.3) -> dict:
    """This CPU's float32 matmul rate (a [size, size] x [size, size] product, FLOP/s: the faster
    of torch's BLAS and, where the engine's C++ operators load, its `few_rows_mm` on [96, size]
    rows, which beats MKL on AMD CPUs) and read bandwidth over a buffer of `nbytes` (at least
    1 MB; bytes/s), at the current thread count: the best of repeated timings (peaks, not
    typical)."""
    import torch

    from wedlm.engine import fast_model

    a, b = torch.randn(size, size), torch.randn(size, size)
    buf = torch.ones(max(nbytes, 1 << 20) // 4)

    def best(fn, work):
        fn()
        rate, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            fn()
            rate = max(rate, work / (time.perf_counter() - start))
        return rate

    flops = best(lambda: torch.mm(a, b), 2 * size ** 3)
    if fast_model.use_native_ops():
        rows, panels = a[:96].contiguous(), fast_model.pack_panels(b)
        flops = max(flops, best(lambda: torch.ops.wedlm_cpu.few_rows_mm(rows, panels, size, None), 2 * 96 * size ** 2))
    return {"peak_flops": flops, "peak_bytes": best(lambda: buf.sum(), buf.numel() * 4)}


def _record_shapes(runner) -> list:
    """Wrap `runner.prepare` to log (tokens, rows, keys, kv rows read) of each forward's real items."""
    shapes, prepare = [], runner.prepare

    def recording(items):
        tokens = sum(len(it.token_ids) for it in items)
        rows = sum(len(it.logit_rows) for it in items)
        keys = sum(n * it.context_len + n * (n + 1) // 2 for it in items for n in [len(it.token_ids)])
        kv_rows = sum(it.context_len + len(it.token_ids) for it in items)
        shapes.append((tokens, rows, keys, kv_rows))
        return prepare(items)

    runner.prepare = recording
    return shapes


def _floor(llm, shapes: list, steps: int) -> dict:
    """Per step: mean FLOPs and bytes of the recorded forwards (`step_cost`), this CPU's peaks
    (`measure_peaks`) and the floor they give."""
    config = llm.engine.runner.model.config
    costs = [step_cost(config, *shape) for shape in shapes]
    flops = sum(c[0] for c in costs) / max(steps, 1)
    nbytes = sum(c[1] for c in costs) / max(steps, 1)
    peaks = measure_peaks(int(nbytes))
    return {"MFLOP": flops / 1e6, "MB read": nbytes / 1e6,
            "peak GFLOP/s": peaks["peak_flops"] / 1e9, "peak GB/s": peaks["peak_bytes"] / 1e9,
            "floor": 1e6 * max(flops / peaks["peak_flops"], nbytes / peaks["peak_bytes"]),
            "forwards per step": len(shapes) / max(steps, 1)}


def profile(model: str, batch: int, max_tokens: int, decoding: str, compiled: bool | None = None,
            device: str = "cpu", dtype: str | None = None, top: int = 0, wall_runs: int = 1) -> dict:
    import torch

    from wedlm import LLM, SamplingParams

    torch.set_num_threads(1)
    extra = {} if compiled is None else {"enforce_eager": not compiled}
    llm = LLM(model, device=device, dtype=dtype, max_num_seqs=max(batch, 1), enable_prefix_caching=False,
              **extra)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, decoding=decoding, ignore_eos=True)
    prompts = [[(7 * i + 3 * j) % 200 + 10 for j in range(24)] for i in range(batch)]
    # ignore_eos: a warm-up answer that stops at its first token would leave the decode graph
    # uncompiled, and its compile (about a second) would land in the timed run
    warm = SamplingParams(temperature=0.0, max_tokens=8, decoding=decoding, ignore_eos=True)
    for group in ([prompts[0]], prompts):  # warm-up (compiled: every graph the timed runs use)
        llm.generate(group, warm)
    walls = []  # without the profiler: the honest wall time of a step, `wall_runs` times
    for run in range(wall_runs):
        for p in prompts:
            llm.add_request(p, params)
        if run == 0:  # the first run's forwards give the floor
            prepare = llm.engine.runner.prepare
            shapes = _record_shapes(llm.engine.runner)
        steps, start = 0, time.perf_counter()
        while llm.has_unfinished():
            llm.step()
            steps += 1
        walls.append(1e6 * (time.perf_counter() - start) / max(steps, 1))
        if run == 0:
            floor = _floor(llm, shapes, steps)
            llm.engine.runner.prepare = prepare
    for p in prompts:
        llm.add_request(p, params)
    prof = cProfile.Profile()
    steps = 0
    prof.enable()
    while llm.has_unfinished():
        llm.step()
        steps += 1
    prof.disable()
    stats = pstats.Stats(prof).stats
    out = {"steps": steps, "step wall, no profiler": min(walls), "walls": walls, **floor}
    if top:  # the functions with the most own time (a device synchronisation shows up here)
        own = sorted(((tottime, f"{Path(path).name}:{line} {name}") for (path, line, name), (_, _, tottime, _, _)
                      in stats.items()), reverse=True)[:top]
        out["top"] = [[label, round(1e6 * t / max(steps, 1))] for t, label in own]
    runner = llm.engine.runner
    if getattr(runner, "compiled", None) is not None:
        out["compile_s"] = runner.compiled.compile_s
    for label, names, where in PARTS:
        total = 0.0
        for (path, _, name), (_, _, _, cumtime, _callers) in stats.items():
            path = path.replace(os.sep, "/")
            if name in names and where in path and "/wedlm/" in path:
                total += cumtime
        out[label] = 1e6 * total / max(steps, 1)
    return out


def print_floor(cells: list[dict]) -> None:
    """The floor rows under a profile table, one column per tree (`_floor`'s keys)."""
    for cell in cells:  # the peaks at their best over the runs: the floor from them
        cell["floor"] = 1e3 * max(cell["MFLOP"] / cell["peak GFLOP/s"], cell["MB read"] / cell["peak GB/s"])
    rows = [("forwards per step", "{:.2f}", lambda c: c["forwards per step"]),
            ("MFLOP per step (float32)", "{:.1f}", lambda c: c["MFLOP"]),
            ("MB read per step (weights + KV)", "{:.1f}", lambda c: c["MB read"]),
            ("peak GFLOP/s (fp32 matmul, 1 thread)", "{:.1f}", lambda c: c["peak GFLOP/s"]),
            ("peak GB/s (read, step-sized buffer)", "{:.1f}", lambda c: c["peak GB/s"]),
            ("floor: max(FLOP/peak, bytes/bandwidth)", "{:.0f}", lambda c: c["floor"]),
            ("step wall, x floor", "{:.2f}x", lambda c: c["step wall, no profiler"] / c["floor"]),
            ("step wall (median of runs), x floor", "{:.2f}x", lambda c: c["step wall, median of runs"] / c["floor"]),
            ("execute (forward + logits), x floor", "{:.2f}x", lambda c: c["execute (forward + logits)"] / c["floor"])]
    for label, fmt, value in rows:
        print(f"| {label} | " + " | ".join(fmt.format(value(c)) for c in cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "wedlm-tiny"))
    ap.add_argument("--batch", type=int, action="append", default=None, help="batch sizes (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--decoding", default="wedlm")
    ap.add_argument("--trees", default=None, help="comma-separated source trees, profiled side by side; "
                    "TREE+compiled runs that tree with enforce_eager=False (warm-up compiles), TREE+eager with "
                    "enforce_eager=True, TREE alone with the tree's default")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per tree, alternating trees; the table keeps each cell's minimum (least load)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (one torch thread on the host either way)")
    ap.add_argument("--dtype", default=None, help="weights dtype, e.g. bfloat16 (default: the checkpoint's)")
    ap.add_argument("--top", type=int, default=0, help="also list the N functions with the most own time per step")
    ap.add_argument("--wall-runs", type=int, default=1,
                    help="unprofiled runs per repeat: the table gives their least and their median step time")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("compiled", "eager"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = args.batch or [1, 8]
    if args.json:
        print(json.dumps({b: profile(args.model, b, args.max_tokens, args.decoding,
                                     None if args.mode is None else args.mode == "compiled", args.device,
                                     args.dtype, args.top, args.wall_runs) for b in batches}))
        return 0
    trees = args.trees.split(",") if args.trees else [str(Path(__file__).resolve().parents[1])]
    runs: list[list[dict]] = [[] for _ in trees]
    for _ in range(args.repeats):  # alternate the trees so load drifts hit them alike
        for i, tree in enumerate(trees):
            path, _, mode = tree.partition("+")  # "TREE+compiled" / "TREE+eager": enforce_eager False / True
            cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--model", args.model,
                   "--max-tokens", str(args.max_tokens), "--decoding", args.decoding, "--device", args.device,
                   "--top", str(args.top), "--wall-runs", str(args.wall_runs)] + (["--dtype", args.dtype] if args.dtype else [])
            cmd += ["--mode", mode] if mode else []
            for b in batches:
                cmd += ["--batch", str(b)]
            env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()), OMP_NUM_THREADS="1")
            text = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[i].append(json.loads(text.strip().splitlines()[-1]))
    best = ("compile_s", "peak GFLOP/s", "peak GB/s")  # kept at their largest; the rest at their least
    results = [{b: {k: (max if k in best else min)(r[b][k] for r in tree_runs) for k in tree_runs[0][b]
                    if k not in ("top", "walls")} for b in tree_runs[0]} for tree_runs in runs]
    for result, tree_runs in zip(results, runs):  # every unprofiled run of every repeat
        for b in result:
            result[b]["step wall, median of runs"] = statistics.median(w for r in tree_runs for w in r[b]["walls"])
    for b in batches:
        b = str(b)
        print(f"\nbatch {b}, decoding {args.decoding}, {args.max_tokens} tokens each; microseconds per step "
              f"(cProfile cumulative, min of {args.repeats}; steps: {', '.join(str(r[b]['steps']) for r in results)})")
        print("| part | " + " | ".join(trees) + " |")
        print("|---|" + "---|" * len(trees))
        for label in ["step wall, no profiler", "step wall, median of runs"] + [label for label, _, _ in PARTS]:
            print(f"| {label} | " + " | ".join(f"{r[b][label]:.0f}" for r in results) + " |")
        if any("compile_s" in r[b] for r in results):
            print("| compile (s, largest of the runs) | "
                  + " | ".join(f"{r[b]['compile_s']:.1f}" if "compile_s" in r[b] else "-" for r in results) + " |")
        print_floor([r[b] for r in results])
        for tree, tree_runs in zip(trees, runs):
            if tree_runs[-1][b].get("top"):
                print(f"\nmost own time per step, {tree} (last run, us): "
                      + "; ".join(f"{label} {us}" for label, us in tree_runs[-1][b]["top"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
