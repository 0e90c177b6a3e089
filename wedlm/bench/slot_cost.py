"""The slot-cost curve: what one forward costs with W window slots over a cached prefix.

What: for each model (the shipped one, random-weight Qwen3 shapes from
`wedlm/testing.py`) and each forward path (eager, compiled), fill the KV cache with a
prefix of `prefix` tokens, then time one engine forward (`ModelRunner.run`, logits at
every slot) that feeds W slots on top of it, for W in 1, 2, 4, ..., 64. A one-slot
forward is an AR step. From the curve, the break-even tokens/forward of `wedlm` at
the engine's window W is t(W) / t(1): streaming decoding beats `ar` in wall clock when
it commits more tokens per forward than that. The measured tokens/forward of greedy
`wedlm` on the model (a few `counting` prompts) is printed next to it, and the engine's
overhead at batch 1: a greedy `ar` / `wedlm` step's wall time over the bare forward of
the same inputs (`engine_overhead`).

Why: whether parallel decoding pays on a machine is decided here, not by
tokens/forward alone. Timings are medians of `repeats` forwards after
warm-up (compilation happens in the warm-up); slot counts run interleaved, repeat by
repeat, so load drifts hit all of them alike.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

SLOTS = (1, 2, 4, 8, 16, 32, 64)
QUICK_SLOTS = (1, 4, 16)
RANDOM_SHAPES = ("random-40m", "random-150m")


@dataclass(slots=True)
class SlotCostConfig:
    """What one slot-cost run measures.

    Attributes:
        models: model folders, or "random-40m" / "random-150m" (random-weight Qwen3
            checkpoints written to a temporary folder from `wedlm.testing` presets).
        slots: window slot counts W per forward (each >= 1).
        prefix: cached tokens the window attends to.
        repeats: timed forwards per slot count (median reported).
        modes: "eager" and/or "compiled" (`enforce_eager` True / False).
        window_size: W whose break-even is reported; None = each model's default.
        device, dtype, autocast: as `wedlm.LLM`.
        tpf_prompts / tpf_max_tokens: greedy `wedlm` runs for the measured tokens/forward.
    """

    models: tuple[str, ...]
    slots: tuple[int, ...] = SLOTS
    prefix: int = 512
    repeats: int = 20
    modes: tuple[str, ...] = ("eager", "compiled")
    window_size: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    autocast: bool | None = None
    tpf_prompts: int = 2
    tpf_max_tokens: int = 64
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("slot cost: give at least one model")
        if not self.slots or min(self.slots) < 1:
            raise ValueError(f"slot cost: slots must be integers >= 1, got {self.slots}")
        if self.prefix < 1 or self.repeats < 1:
            raise ValueError(f"slot cost: prefix and repeats must be >= 1, got {self.prefix}, {self.repeats}")
        bad = [m for m in self.modes if m not in ("eager", "compiled")]
        if bad or not self.modes:
            raise ValueError(f"slot cost: modes must be 'eager' and/or 'compiled', got {self.modes}")


def resolve_model(name: str, workdir: Path) -> Path:
    """A model folder: `name` itself, or a random-weight checkpoint for "random-40m" / "random-150m"."""
    if name not in RANDOM_SHAPES:
        return Path(name)
    from wedlm.testing import LARGE_150M, MEDIUM_40M, make_hf_checkpoint

    shape = MEDIUM_40M if name == "random-40m" else LARGE_150M
    return make_hf_checkpoint(workdir / name, family="qwen3", wedlm=True, tokenizer=True, init_std=0.02, **shape)


def time_forwards(runner, slots: tuple[int, ...], prefix: int, repeats: int, mask_id: int,
                  progress=None) -> dict[int, float]:
    """Median milliseconds of one forward feeding W slots over a cached `prefix`, per W.

    The prefix is prefilled once into blocks 0.. of the runner's cache; every timed forward
    writes its W slots right after it (the same rows each time) and asks for logits at all W.
    """
    from wedlm.engine.runner import ForwardItem

    bs = runner.kv_cache.block_size
    table = list(range(-(-(prefix + max(slots)) // bs)))
    gen = torch.Generator().manual_seed(0)
    vocab = runner.model.config.vocab_size
    ids = torch.randint(0, vocab, (prefix,), generator=gen).tolist()
    runner.run([ForwardItem(ids, list(range(prefix)), table, 0, [prefix - 1])])

    def item(w: int) -> ForwardItem:
        return ForwardItem([mask_id] * w, list(range(prefix, prefix + w)), table, prefix, list(range(w)))

    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    for w in slots:  # warm-up (and compilation) of every shape
        for _ in range(2):
            runner.run([item(w)])
    times: dict[int, list[float]] = {w: [] for w in slots}
    for _ in range(repeats):
        for w in slots:
            sync()
            t0 = time.perf_counter()
            runner.run([item(w)])
            sync()
            times[w].append(1000 * (time.perf_counter() - t0))
        if progress is not None:
            progress.update(1)
    return {w: statistics.median(v) for w, v in times.items()}


def break_even(curve: dict[int, float], window: int) -> float:
    """t(W) / t(1): tokens per forward `wedlm` must commit at window W to beat `ar` (one slot).

    W between measured slot counts is interpolated linearly; beyond them, the nearest is used.
    """
    xs = sorted(curve)
    one = curve[1] if 1 in curve else curve[xs[0]]
    if window <= xs[0]:
        return curve[xs[0]] / one
    for lo, hi in zip(xs, xs[1:]):
        if lo <= window <= hi:
            t = curve[lo] + (curve[hi] - curve[lo]) * (window - lo) / (hi - lo)
            return t / one
    return curve[xs[-1]] / one


def counting_prompts(llm, n: int, max_tokens: int) -> list[list[int]]:
    """Token ids of the first n `counting` bench prompts (chat template)."""
    from wedlm.bench.tasks import bench_task
    from wedlm.evaluate.runner import render_prompts

    task = bench_task("counting", n, True, max_tokens)
    return render_prompts(llm.tokenizer, task.items[:n], chat=True)


def engine_overhead(llm, prompt: list[int], decoding: str, max_tokens: int) -> dict:
    """Engine step time over the bare forward of the same inputs, batch 1.

    The target is a ratio <= 1.2: scheduling, decoding and metadata add at most a fifth to a step.

    Runs one greedy request once untimed (so both sides meet every step shape warm: on CUDA
    a first pass pays graph captures and first-use kernel selection, which the replay below
    would not), then again step by step, recording each step's wall time and its
    `ForwardItem`s; then replays every decode step's items through `runner.execute` on
    metadata prepared beforehand (the model forward, logits and argmax only: no scheduler,
    decoder, metadata or detokenizer). The prefill step is left out of both sums.

    Returns:
        {"step_ms", "bare_ms" (means per decode step), "overhead" (ratio of the sums), "steps"}.
    """
    from wedlm import SamplingParams

    runner = llm.engine.runner
    captured: list = []
    real_run = runner.run

    def run(items):
        captured.append(items)
        return real_run(items)

    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, decoding=decoding, ignore_eos=True)
    llm.generate([prompt], params)  # warm-up over the same step shapes
    runner.run = run  # an instance attribute: the class's method is untouched
    try:
        llm.add_request(prompt, params)
        steps = []
        while llm.has_unfinished():
            t0 = time.perf_counter()
            llm.step()
            sync()
            steps.append(time.perf_counter() - t0)
    finally:
        del runner.run
    bare = []
    for items in captured[1:]:
        batch = runner.prepare(items)
        sync()
        t0 = time.perf_counter()
        runner.execute(items, batch)
        sync()
        bare.append(time.perf_counter() - t0)
    n = max(len(bare), 1)
    return {"step_ms": 1000 * sum(steps[1:]) / n, "bare_ms": 1000 * sum(bare) / n,
            "overhead": sum(steps[1:]) / sum(bare) if bare else None, "steps": len(bare)}


def measured_tokens_per_forward(llm, prompts: int, max_tokens: int, window: int) -> float:
    """Tokens/forward of greedy `wedlm` decoding on the first `counting` bench prompts (ratio of sums)."""
    from wedlm import SamplingParams

    ids = counting_prompts(llm, prompts, max_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, decoding="wedlm", wedlm_window_size=window)
    outs = llm.generate(ids, params)
    tokens = sum(o["stats"]["decode_tokens"] for o in outs)
    forwards = sum(o["stats"]["decode_forwards"] for o in outs)
    return tokens / forwards if forwards else 0.0


def run_slot_cost(cfg: SlotCostConfig) -> dict:
    """The curve for every model and mode; a JSON-ready dict with `rows` (one per model and mode:
    `ms` per slot count, `ratio_16_vs_1` when measured, `break_even`, `tokens_per_forward`)."""
    from wedlm import LLM

    rows = []
    bar = tqdm(total=len(cfg.models) * len(cfg.modes) * cfg.repeats, desc="slot cost", unit="round",
               disable=not cfg.progress)
    with tempfile.TemporaryDirectory(prefix="wedlm-slot-cost-") as tmp:
        for name in cfg.models:
            path = resolve_model(name, Path(tmp))
            tpf = None
            for mode in cfg.modes:
                max_len = max(cfg.prefix + max(cfg.slots) + 64, 256 + cfg.tpf_max_tokens)
                llm = LLM(str(path), wedlm_window_size=cfg.window_size, max_model_len=max_len,
                          max_num_seqs=max(1, cfg.tpf_prompts), device=cfg.device, dtype=cfg.dtype,
                          enforce_eager=mode == "eager", autocast=cfg.autocast, enable_prefix_caching=False)
                engine = llm.engine
                bar.set_postfix_str(f"{name} {mode}")
                start = time.perf_counter()
                curve = time_forwards(engine.runner, cfg.slots, cfg.prefix, cfg.repeats,
                                      engine.mask_token_id if engine.mask_token_id is not None else 0, bar)
                if tpf is None and engine.mask_token_id is not None and cfg.tpf_prompts > 0:
                    tpf = measured_tokens_per_forward(llm, cfg.tpf_prompts, cfg.tpf_max_tokens, engine.window_size)
                overhead = {}
                if cfg.tpf_prompts > 0:
                    prompt = counting_prompts(llm, 1, cfg.tpf_max_tokens)[0]
                    decoders = ("ar", "wedlm") if engine.mask_token_id is not None else ("ar",)
                    overhead = {d: engine_overhead(llm, prompt, d, cfg.tpf_max_tokens) for d in decoders}
                compiled = engine.runner.compiled
                rows.append({
                    "model": name, "params_m": sum(p.numel() for p in engine.model.parameters()) / 1e6,
                    "mode": mode, "precision": engine.precision, "matmuls": engine.matmuls,
                    "window": engine.window_size,
                    "ms": {str(w): t for w, t in curve.items()},
                    "ratio_16_vs_1": curve[16] / curve[1] if 16 in curve and 1 in curve else None,
                    "break_even": break_even(curve, engine.window_size), "tokens_per_forward": tpf,
                    "engine_overhead": overhead,
                    "compile_s": compiled.compile_s if compiled else 0.0,
                    "elapsed_s": time.perf_counter() - start})
                llm.close()
    bar.close()
    from wedlm.evaluate.machine import machine_info, machine_line

    info = machine_info(cfg.device)
    out = asdict(cfg)
    out.pop("progress")
    return {"schema": "wedlm-slot-cost/1", "config": out, "machine": info, "machine_line": machine_line(info),
            "rows": rows}


def markdown(result: dict, img: str | None = "img/bench_slot_cost.png") -> str:
    """The slot-cost section: a table of ms per forward by slot count, 16-vs-1 ratio, break-even."""
    cfg = result["config"]
    slots = [str(w) for w in cfg["slots"]]
    lines = ["## Slot cost: one forward with W window slots over a cached prefix", "",
             f"Prefix {cfg['prefix']} cached tokens; median of {cfg['repeats']} forwards per point "
             f"(ms); {result['machine_line']}. Break-even = t(W)/t(1) at the engine's window W: "
             "`wedlm` beats `ar` in wall clock when it commits more tokens per forward than that. "
             "step/bare = engine step time over the bare forward (runner.execute on prepared metadata) "
             "of the same inputs, batch 1, one greedy request (target <= 1.2).", "",
             "| model | params (M) | path | " + " | ".join(f"W={w}" for w in slots)
             + " | 16 vs 1 | W | break-even tok/fwd | measured tok/fwd | step/bare ar | step/bare wedlm"
             " | compile (s) |",
             "|---|---|---|" + "---|" * len(slots) + "---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ratio = "-" if r["ratio_16_vs_1"] is None else f"{r['ratio_16_vs_1']:.2f}x"
        tpf = "-" if r["tokens_per_forward"] is None else f"{r['tokens_per_forward']:.2f}"
        lines.append(f"| {model_label(r['model'])} | {r['params_m']:.0f} | {r['mode']} | "
                     + " | ".join(f"{r['ms'][w]:.2f}" for w in slots)
                     + f" | {ratio} | {r['window']} | {r['break_even']:.2f} | {tpf} | {_overhead(r, 'ar')}"
                     f" | {_overhead(r, 'wedlm')} | {r['compile_s']:.1f} |")
    paths = dict.fromkeys(f"{r['precision']}; {r.get('matmuls', 'BLAS matmuls')}" for r in result["rows"])
    lines += ["", "Forward: " + " / ".join(paths)]
    if img:
        lines += ["", f"![slot cost]({img})"]
    return "\n".join(lines) + "\n"


def model_label(model: str) -> str:
    """How a model is named in the table and plot: a folder by its last part, presets as given."""
    return Path(model).name if ("/" in model or "\\" in model) else model


def _overhead(row: dict, decoding: str) -> str:
    found = row.get("engine_overhead", {}).get(decoding)
    if not found or found["overhead"] is None:
        return "-"
    return f"{found['overhead']:.2f}x ({found['step_ms']:.2f} ms)"


def draw_curve(ax, row: dict, color: str, label: str) -> None:
    """One slot-cost row on a matplotlib axis: ms per forward against W, solid when eager,
    dashed when compiled."""
    xs = sorted(int(w) for w in row["ms"])
    ax.plot(xs, [row["ms"][str(w)] for w in xs], marker="o", color=color,
            linestyle="-" if row["mode"] == "eager" else "--", label=label)


def style_axis(ax, title: str, **title_kw) -> None:
    """Log-2 W axis, axis labels, `title`, small legend: the look of every slot-cost plot."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window slots W per forward")
    ax.set_ylabel("ms per forward")
    ax.set_title(title, **title_kw)
    ax.legend(fontsize=7)


def plot(result: dict, path: Path) -> None:
    """ms per forward against slot count (log-2 x axis), one line per model and path."""
    from .plots import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, r in enumerate(result["rows"]):
        draw_curve(ax, r, f"C{i // 2 % 10}", f"{model_label(r['model'])} ({r['mode']})")
    style_axis(ax, f"Slot cost over a {result['config']['prefix']}-token cached prefix")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_slot_cost(result: dict, out_dir: str | Path, plots: bool = True) -> dict[str, Path]:
    """slot_cost.json, slot_cost.md and img/bench_slot_cost.png into `out_dir`."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "slot_cost.json", "markdown": out / "slot_cost.md"}
    paths["json"].write_text(json.dumps(result, indent=2))
    if plots:
        paths["plot"] = out / "img" / "bench_slot_cost.png"
        paths["plot"].parent.mkdir(parents=True, exist_ok=True)
        plot(result, paths["plot"])
    paths["markdown"].write_text(markdown(result, "img/bench_slot_cost.png" if plots else None))
    return paths
