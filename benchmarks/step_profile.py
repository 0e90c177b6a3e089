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

Between the two: the step's host work (everything but the runner's forward call: scheduling,
metadata, logits glue, decoder updates, commit, detokenization), measured twice without the
profiler. Once as the step's time less its forward calls, timed in the same runs; once with the
forward replayed: the same answers again, each forward call returning the outputs recorded for
it (no kernels run, so no weights stream through the caches between the host's steps). The two
differ by what the host work pays for caches the forward swept.

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


class _TimedForward:
    """Stands in for the runner's forward (`runner.compiled`, or `forward_logits` when eager):
    calls it and adds up the seconds its calls take (`seconds`; on a GPU until its work is done),
    or, once `replay` holds outputs, returns those in order instead of calling it."""

    def __init__(self, runner) -> None:
        import torch

        from wedlm.engine import runner as runner_module

        self.runner, self.module, self.synchronize = runner, runner_module, torch.cuda.synchronize
        self.inner = runner.compiled or runner_module.forward_logits
        self.seconds, self.record, self.replay = 0.0, None, None

    def __enter__(self) -> _TimedForward:
        # an eager runner (no `compiled`) calls the runner module's `forward_logits`; setting
        # `compiled` would make it pad its inputs as for a graph
        if self.runner.compiled is not None:
            self.runner.compiled = self
        else:
            self.module.forward_logits = self
        return self

    def __exit__(self, *exc) -> None:
        if self.runner.compiled is self:
            self.runner.compiled = self.inner
        else:
            self.module.forward_logits = self.inner

    def __call__(self, *args):
        if self.replay is not None:
            return self.replay.pop()
        start = time.perf_counter()
        out = self.inner(*args)
        if out[0].device.type == "cuda":  # else the wait lands in the host's first read of the outputs
            self.synchronize()
        self.seconds += time.perf_counter() - start
        if self.record is not None:
            self.record.append(tuple(t.clone() for t in out))
        return out


def _run(llm, prompts, params) -> tuple[int, float, list[list[int]]]:
    """Answer `prompts` step by step: (steps, seconds, each request's committed ids in order)."""
    ids = [llm.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    steps, start = 0, time.perf_counter()
    while llm.has_unfinished():
        for delta in llm.step():
            tokens[delta.request_id] += delta.new_token_ids
        steps += 1
    return steps, time.perf_counter() - start, [tokens[i] for i in ids]


def _host_work(llm, prompts, params, runs: int) -> dict:
    """The step's host work (`Engine.step` less the forward calls), in microseconds per step: the
    median over `runs` runs with the real forward, and over as many with the forward replayed from
    a recording (None when the replayed answers differ from the recorded ones, as they would if
    anything changed the recorded outputs in place). A forward that asks for no logits (an eager
    prefill chunk) is not the runner's forward call: it counts as host work and runs in the replay
    too; the profile's prompts fit in one step."""
    with _TimedForward(llm.engine.runner) as forward:
        forward.record = []
        _, _, expected = _run(llm, prompts, params)
        recorded, forward.record = forward.record, None
        cold, warm = [], []
        for _ in range(runs):
            forward.seconds = 0.0
            steps, seconds, _ = _run(llm, prompts, params)
            cold.append(1e6 * (seconds - forward.seconds) / steps)
            forward.replay = list(reversed(recorded))
            steps, seconds, answers = _run(llm, prompts, params)
            forward.replay = None
            warm.append(1e6 * seconds / steps if answers == expected else None)
    return {"host work": statistics.median(cold),
            "host work, forward replayed": None if None in warm else statistics.median(warm)}


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
            device: str = "cpu", dtype: str | None = None, top: int = 0, wall_runs: int = 1,
            quantization: str | None = None) -> dict:
    import torch

    from wedlm import LLM, SamplingParams

    torch.set_num_threads(1)
    extra = {} if compiled is None else {"enforce_eager": not compiled}
    if quantization:
        extra["quantization"] = quantization
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
        if run == 0:  # the first run's forwards give the floor
            prepare = llm.engine.runner.prepare
            shapes = _record_shapes(llm.engine.runner)
        steps, seconds, _ = _run(llm, prompts, params)
        walls.append(1e6 * seconds / max(steps, 1))
        if run == 0:
            floor = _floor(llm, shapes, steps)
            llm.engine.runner.prepare = prepare
    host = _host_work(llm, prompts, params, wall_runs)
    prof = cProfile.Profile()
    prof.enable()
    steps, _, _ = _run(llm, prompts, params)
    prof.disable()
    stats = pstats.Stats(prof).stats
    out = {"steps": steps, "step wall, no profiler": min(walls), "walls": walls, **floor, **host}
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


def _pooled(values: list, pick):
    """`pick` (min or max) of the runs' values, or None where a run has none (a replay that gave
    other answers)."""
    return None if None in values else pick(values)


def print_host_work(cells: list[dict]) -> None:
    """The host-work rows under a profile table, one column per tree (`_host_work`'s keys)."""
    for label, key in (("host work (step less its forward calls)", "host work"),
                       ("host work, forward replayed (warm caches)", "host work, forward replayed")):
        print(f"| {label} | " + " | ".join("-" if c.get(key) is None else f"{c[key]:.0f}" for c in cells) + " |")


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
    ap.add_argument("--quantization", choices=("int8", "bf16"), default=None,
                    help="the engine's option (the floor stays float32's)")
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
                                     args.dtype, args.top, args.wall_runs, args.quantization) for b in batches}))
        return 0
    trees = args.trees.split(",") if args.trees else [str(Path(__file__).resolve().parents[1])]
    runs: list[list[dict]] = [[] for _ in trees]
    for _ in range(args.repeats):  # alternate the trees so load drifts hit them alike
        for i, tree in enumerate(trees):
            path, _, mode = tree.partition("+")  # "TREE+compiled" / "TREE+eager": enforce_eager False / True
            cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--model", args.model,
                   "--max-tokens", str(args.max_tokens), "--decoding", args.decoding, "--device", args.device,
                   "--top", str(args.top), "--wall-runs", str(args.wall_runs)] + (["--dtype", args.dtype] if args.dtype else [])
            cmd += ["--quantization", args.quantization] if args.quantization else []
            cmd += ["--mode", mode] if mode else []
            for b in batches:
                cmd += ["--batch", str(b)]
            env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()), OMP_NUM_THREADS="1")
            text = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[i].append(json.loads(text.strip().splitlines()[-1]))
    best = ("compile_s", "peak GFLOP/s", "peak GB/s")  # kept at their largest; the rest at their least
    results = [{b: {k: _pooled([r[b][k] for r in tree_runs], max if k in best else min) for k in tree_runs[0][b]
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
        print_host_work([r[b] for r in results])
        print_floor([r[b] for r in results])
        for tree, tree_runs in zip(trees, runs):
            if tree_runs[-1][b].get("top"):
                print(f"\nmost own time per step, {tree} (last run, us): "
                      + "; ".join(f"{label} {us}" for label, us in tree_runs[-1][b]["top"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
