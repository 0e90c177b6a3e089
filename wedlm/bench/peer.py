"""`wedlm bench --peer llama.cpp`: the engine's decoders against llama.cpp's AR on the same weights.

What: `run_peer(PeerConfig)` writes the checkpoint as a float32 GGUF file (`gguf_export`; Q8_0,
llama.cpp's 8-bit format, when the engine runs `quantization="int8"`), loads
it in llama.cpp (llama-cpp-python) and the same folder in the engine (one `LLM` per forward
mode: eager and compiled), and decodes the same prompt token ids with each system at batch 1,
one thread each, greedy: llama.cpp AR, then `wedlm`, `verified` and `ar` of the engine. Each
prompt is timed whole, from the call to the last token (prefill included), all systems back to
back in a rotated order within a repeat; per task the ratio of llama.cpp's time to a system's
time is taken repeat by repeat and its median reported. Answers are compared token for token
with llama.cpp's (trailing stop ids dropped on both sides). `peer_markdown` and
`write_peer` turn the result into `llama_cpp_peer.json`, `llama_cpp_peer.md` and
`img/bench_llama_cpp_peer.png`.

Why: the paper's claim is wall clock against an optimized AR engine on the same weights; on a
CPU that engine is llama.cpp. llama-cpp-python is optional: without it `PeerUnavailable` says
how to install it. Importing this module loads no torch (the command-line parser reads `PEERS`).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

from tqdm import tqdm

from .tasks import BENCH_TASKS, bench_task

PEERS = ("llama.cpp",)
SCHEMA = "wedlm-bench-peer/1"
PEER_TASKS = ("counting", "arithmetic", "listops")
# prompts per task (full, quick); counting's first is the headline "Count from 1 to 200."
PEER_ITEMS = {"counting": (3, 1), "arithmetic": (4, 2), "listops": (4, 2), "code": (2, 1), "text": (2, 1)}
PEER_DECODERS = ("wedlm", "verified", "ar")
INSTALL_HINT = ("pip install llama-cpp-python gguf  (llama-cpp-python compiles llama.cpp from source: "
                "about 10 minutes on 2 cores)")


class PeerUnavailable(ImportError):
    """The peer's Python package is not installed; the message says how to install it."""


def import_llama_cpp():
    """The `llama_cpp` module (and `gguf`, which writes its file).

    Raises:
        PeerUnavailable: either is missing, with the pip command.
    """
    try:
        import gguf  # noqa: F401  (gguf_export's writer)
        import llama_cpp
    except ImportError as err:
        raise PeerUnavailable(f"--peer llama.cpp needs the optional package {err.name or 'llama_cpp'}: "
                              f"{INSTALL_HINT}") from None
    return llama_cpp


def engine_default_mode() -> str:
    """The forward mode `LLM(...)` runs without `enforce_eager`: "eager" or "compiled"."""
    from wedlm import LLM

    return "eager" if inspect.signature(LLM.__init__).parameters["enforce_eager"].default is True else "compiled"


@dataclass(slots=True)
class PeerConfig:
    """What one `wedlm bench --peer llama.cpp` run measures.

    Attributes:
        model: checkpoint folder (any the GGUF writer supports: `gguf_export.gguf_arch`).
        tasks: subset of `BENCH_TASKS` (default: counting, arithmetic, listops).
        items: prompts per task; None = PEER_ITEMS (full or quick).
        max_tokens: every task's answer budget (None = the task's, `tasks.MAX_TOKENS`).
        repeats: timed repeats after one untimed pass over every prompt.
        modes: the engine's forward modes, "eager" and/or "compiled".
        decoders: the engine's decoders, in table order.
        threads: torch threads and llama.cpp threads (the same for both).
        window_size: engine window W (None = the model's).
        autocast, quantization: as `wedlm.LLM` (float32, no int8 by default). llama.cpp's file follows:
            float32 weights, Q8_0 (llama.cpp's 8-bit format) beside `quantization="int8"`, bf16
            matrices beside `quantization="bf16"`.
    """

    model: str
    tasks: tuple[str, ...] = PEER_TASKS
    items: dict[str, int] | None = None
    quick: bool = False
    max_tokens: int | None = None
    repeats: int = 3
    modes: tuple[str, ...] = ("eager", "compiled")
    decoders: tuple[str, ...] = PEER_DECODERS
    threads: int = 1
    window_size: int | None = None
    autocast: bool | None = None
    quantization: str | None = None
    command: str = ""
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in BENCH_TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"unknown task(s) {unknown}; expected some of {BENCH_TASKS}")
        bad = [m for m in self.modes if m not in ("eager", "compiled")]
        if bad or not self.modes:
            raise ValueError(f"modes must be some of eager, compiled; got {list(self.modes)}")
        if self.repeats < 1 or self.threads < 1:
            raise ValueError(f"repeats and threads must be >= 1, got {self.repeats}, {self.threads}")
        if self.items is None:
            self.items = {t: PEER_ITEMS[t][1 if self.quick else 0] for t in self.tasks}


def llama_run(llm, prompt: list[int], max_tokens: int, stops: set[int]) -> dict:
    """Greedy decode of one prompt with llama-cpp-python, its cache reset first (no prefix reuse).

    Returns:
        {"tokens": ids (the stop id included when one ended the answer), "wall_s": call to last
        token, "wall_ms_per_token": per token after the first, "eval_ms_per_token": llama.cpp's own
        C++ forward time per token (`llama_perf_context`)}.
    """
    import llama_cpp

    start = time.perf_counter()
    llm.reset()
    ctx = llm._ctx.ctx  # the raw llama_context the perf counters take (llama-cpp-python 0.3 keeps it here)
    llama_cpp.llama_perf_context_reset(ctx)
    out, first_at = [], None
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if first_at is None:
            first_at = time.perf_counter()
        out.append(tok)
        if tok in stops or len(out) >= max_tokens:
            break
    end = time.perf_counter()
    perf = llama_cpp.llama_perf_context(ctx)
    return {"tokens": out, "wall_s": end - start,
            "wall_ms_per_token": 1e3 * (end - (first_at or end)) / max(1, len(out) - 1),
            "eval_ms_per_token": perf.t_eval_ms / max(1, perf.n_eval)}


# The child of `extra_buffers_work`: load the file with llama.cpp's defaults, prefill 16 tokens
# (the AMX crash needs a batch of two or more) and decode two.
PROBE_CODE = ("import sys; from wedlm.bench.peer import llama_load; "
              "llm = llama_load(sys.argv[1], int(sys.argv[2]), 64, extra_buffers=True); "
              "toks = llm.tokenize(b'Count from 1 to 20, then name the capital of Japan. ' * 4)[:16]; "
              "next(t for i, t in enumerate(llm.generate(toks, temp=0.0)) if i == 1)")
PLAIN_BUFFERS_NOTE = ("llama.cpp's extra CPU buffer types (AMX and repacked weight layouts) off: with them "
                      "llama.cpp crashed on this file and CPU (ggml-org/llama.cpp#20824)")


def extra_buffers_work(gguf_path: str | Path, threads: int, timeout_s: float = 600.0) -> bool:
    """Whether llama.cpp decodes `gguf_path` with its default (extra) CPU buffer types without
    dying: one load, a 16-token prefill and a two-token decode in a child process.

    On some AMX CPUs llama.cpp's AMX matmul segfaults on quantized files (ggml-org/llama.cpp#20824;
    Q8_0 and Q4_1 on a Xeon with AMX and llama-cpp-python 0.3.36, from a batch of two tokens: a
    one-token prompt decodes), which would take the benchmark's process with it. Returns False
    when the child died by a signal or ran past `timeout_s`; any other failure shows again, as a
    Python error, when the file is loaded for real.
    """
    cmd = [sys.executable, "-c", PROBE_CODE, str(gguf_path), str(threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode >= 0


@contextmanager
def _default_model_params(**fields):
    """llama-cpp-python's `Llama` takes its model parameters from `llama_model_default_params()`
    and exposes no argument for `use_extra_bufts`; this sets `fields` on them while `Llama` loads.

    Raises:
        PeerUnavailable: this llama-cpp-python's parameters have no such field (ctypes would take
            the assignment as a plain attribute, which llama.cpp never sees).
    """
    import llama_cpp
    import llama_cpp.llama as binding

    original = binding.llama_cpp.llama_model_default_params
    missing = sorted(set(fields) - {name for name, _ in type(original())._fields_})
    if missing:
        raise PeerUnavailable(f"llama-cpp-python {llama_cpp.__version__} has no model parameter "
                              f"{', '.join(missing)}; a newer one has: {INSTALL_HINT}")

    def patched():
        params = original()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    binding.llama_cpp.llama_model_default_params = patched
    try:
        yield
    finally:
        binding.llama_cpp.llama_model_default_params = original


def llama_load(gguf_path: str | Path, threads: int, n_ctx: int, extra_buffers: bool = True):
    """`llama_cpp.Llama` on `gguf_path` (batch 512, `threads` for prefill and decode, quiet).
    `extra_buffers=False` loads the weights without llama.cpp's extra CPU buffer types
    (`use_extra_bufts`: the AMX and repacked layouts), as plain ggml tensors."""
    llama_cpp = import_llama_cpp()
    with _default_model_params(use_extra_bufts=extra_buffers):
        return llama_cpp.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                               n_threads_batch=threads, verbose=False)


class LlamaCppSystem:
    """llama.cpp AR (greedy, float32 or Q8_0 GGUF) behind the bench's `generate(prompts, max_tokens)`.

    Attributes:
        buffers: "default", or `PLAIN_BUFFERS_NOTE` when llama.cpp's defaults crashed on the file
            (`extra_buffers_work`) and it runs without its extra CPU buffer types.
    """

    name = "llama.cpp"

    def __init__(self, gguf_path: Path, threads: int, n_ctx: int, stop_ids: set[int]) -> None:
        llama_cpp = import_llama_cpp()
        extra = extra_buffers_work(gguf_path, threads)
        self.llm = llama_load(gguf_path, threads, n_ctx, extra_buffers=extra)
        self.buffers = "default" if extra else PLAIN_BUFFERS_NOTE
        self.stop_ids = stop_ids
        self.version = llama_cpp.__version__

    def close(self) -> None:
        """Free llama.cpp's model and context now (its finalizer can fail at interpreter exit)."""
        self.llm.close()

    def generate(self, prompt: list[int], max_tokens: int) -> dict:
        """Greedy answer to one prompt: {"token_ids", "wall_s", "decode_forwards", "decode_tokens"}."""
        r = llama_run(self.llm, prompt, max_tokens, self.stop_ids)
        n = len(r["tokens"])
        return {"token_ids": r["tokens"], "wall_s": r["wall_s"], "decode_forwards": n, "decode_tokens": n}


class EnginePeerSystem:
    """One decoder of a shared `LLM`, greedy, one prompt per call."""

    def __init__(self, llm, decoding: str, mode: str, window_size: int | None) -> None:
        self.llm, self.decoding, self.mode, self.window_size = llm, decoding, mode, window_size
        self.name = f"{decoding} {mode}"

    def generate(self, prompt: list[int], max_tokens: int) -> dict:
        """Greedy answer to one prompt, timed around `LLM.generate`; the keys of `LlamaCppSystem.generate`."""
        from wedlm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, decoding=self.decoding,
                                wedlm_window_size=self.window_size, seed=0)
        start = time.perf_counter()
        out = self.llm.generate([prompt], params)[0]
        wall = time.perf_counter() - start
        stats = out["stats"]
        return {"token_ids": out["token_ids"], "wall_s": wall, "decode_forwards": stats["decode_forwards"],
                "decode_tokens": stats["decode_tokens"]}


def _engines(cfg: PeerConfig) -> dict:
    """mode -> `LLM` on the checkpoint (batch 1, no prefix caching: every system prefills every prompt)."""
    from wedlm import LLM

    return {mode: LLM(model=cfg.model, wedlm_window_size=cfg.window_size, max_num_seqs=1, device="cpu",
                      dtype="float32", enable_prefix_caching=False, enforce_eager=mode == "eager",
                      autocast=cfg.autocast, quantization=cfg.quantization) for mode in cfg.modes}


def _time_all(cfg: PeerConfig, systems: list, prompts: dict, budgets: dict) -> dict:
    """{(task, prompt index, system name): [run dicts, one per repeat]} after an untimed pass."""
    total = (cfg.repeats + 1) * sum(len(p) for p in prompts.values()) * len(systems)
    bar = tqdm(total=total, desc="bench --peer", unit="run", disable=not cfg.progress)
    runs: dict[tuple[str, int, str], list[dict]] = {}
    for rep in range(-1, cfg.repeats):  # -1: warm-up (compiles graphs, fills allocators); not recorded
        turn = 0
        for task, task_prompts in prompts.items():
            for i, prompt in enumerate(task_prompts):
                k = (rep + turn) % len(systems)
                for system in systems[k:] + systems[:k]:
                    bar.set_postfix_str(f"{task} #{i} {system.name}")
                    r = system.generate(prompt, budgets[task])
                    if rep >= 0:
                        runs.setdefault((task, i, system.name), []).append(r)
                    bar.update(1)
                turn += 1
    bar.close()
    return runs


def _row(task: str, n: int, system, runs: dict, stops: set[int], repeats: int) -> dict:
    """One (task, system) row: medians over repeats of the task's total wall clock and of the
    per-repeat ratio to llama.cpp; tokens per forward; answers equal to llama.cpp's."""
    from .runner import strip_stops

    mine = [runs[(task, i, system.name)] for i in range(n)]
    peer = [runs[(task, i, LlamaCppSystem.name)] for i in range(n)]
    totals = [sum(p[r]["wall_s"] for p in mine) for r in range(repeats)]
    peer_totals = [sum(p[r]["wall_s"] for p in peer) for r in range(repeats)]
    tokens = sum(len(strip_stops(p[0]["token_ids"], stops)) for p in mine)
    forwards = sum(p[0]["decode_forwards"] for p in mine)
    decoded = sum(p[0]["decode_tokens"] for p in mine)  # the stop token too: it took its forward
    same = sum(strip_stops(a[0]["token_ids"], stops) == strip_stops(b[0]["token_ids"], stops)
               for a, b in zip(mine, peer))
    return {"task": task, "system": system.name, "decoding": getattr(system, "decoding", "ar"),
            "mode": getattr(system, "mode", None), "items": n, "tokens": tokens, "wall_s": median(totals),
            "tokens_per_s": tokens / median(totals) if median(totals) > 0 else 0.0,
            "tokens_per_forward": decoded / forwards if forwards else 0.0,
            "speedup_vs_llama_cpp": median(p / s for p, s in zip(peer_totals, totals) if s > 0),
            "same_as_llama_cpp": same, "repeats_wall_s": totals}


def run_peer(cfg: PeerConfig) -> dict:
    """Run the peer benchmark; returns the JSON-ready result (keys: schema, command, created, model,
    machine, machine_line, llama_cpp, engine, default_mode, config, tasks, results, elapsed_s).

    Raises:
        PeerUnavailable: llama-cpp-python or gguf is not installed.
        GGUFExportError: the checkpoint cannot be written as GGUF (names the field or tensor).
    """
    import torch

    from wedlm.evaluate.machine import machine_info, machine_line
    from wedlm.evaluate.runner import render_prompts
    from wedlm.tokenizer import stop_token_ids

    from .gguf_export import write_gguf

    import_llama_cpp()
    t_start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory() as tmp:
        gguf_type = peer_gguf_type(cfg.quantization)
        path = write_gguf(cfg.model, Path(tmp) / f"model-{gguf_type}.gguf", gguf_type)  # refuses a model first
        engines = _engines(cfg)
        first = next(iter(engines.values()))
        stops = set(stop_token_ids(first.tokenizer, cfg.model))
        tasks = {name: bench_task(name, cfg.items[name], cfg.quick, cfg.max_tokens) for name in cfg.tasks}
        prompts = {name: render_prompts(first.tokenizer, t.items, chat=True) for name, t in tasks.items()}
        budgets = {name: t.max_tokens for name, t in tasks.items()}
        n_ctx = max(len(p) for ps in prompts.values() for p in ps) + max(budgets.values()) + 8
        peer = LlamaCppSystem(path, cfg.threads, n_ctx, stops)
        systems = [peer] + [EnginePeerSystem(engines[m], d, m, cfg.window_size) for m in cfg.modes
                            for d in cfg.decoders]
        try:
            runs = _time_all(cfg, systems, prompts, budgets)
        finally:
            peer.close()
    results = [_row(name, len(prompts[name]), s, runs, stops, cfg.repeats) for name in cfg.tasks for s in systems]
    info = machine_info("cpu")
    return {"schema": SCHEMA, "command": cfg.command,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "model": cfg.model, "machine": info, "machine_line": machine_line(info),
            "llama_cpp": peer.version, "llama_cpp_buffers": peer.buffers, "gguf_type": gguf_type, "default_mode": engine_default_mode(),
            "engine": {"precision": first.engine.precision, "matmuls": first.engine.matmuls,
                       "window_size": first.engine.window_size},
            "config": _config_dict(cfg),
            "tasks": [{"name": t.name, "kind": t.kind, "max_tokens": t.max_tokens, "items": len(prompts[t.name]),
                       "prompts": [item.messages[-1]["content"] for item in t.items]} for t in tasks.values()],
            "results": results, "elapsed_s": time.perf_counter() - t_start}


_GGUF_WORDS = {"f32": "float32", "q8_0": "Q8_0 (8-bit)", "bf16": "bf16"}


def peer_gguf_type(quantization: str | None) -> str:
    """The GGUF weight type llama.cpp runs beside an engine with `quantization`: its own 8-bit
    format (Q8_0: int8 blocks of 32 weights, one scale each) beside int8, bf16 matrices beside bf16
    weights, float32 otherwise."""
    return {"int8": "q8_0", "bf16": "bf16"}.get(quantization, "f32")


def _config_dict(cfg: PeerConfig) -> dict:
    out = asdict(cfg)
    out.pop("progress", None)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def _cell(row: dict) -> str:
    tpf = f" ({row['tokens_per_forward']:.1f} tok/fwd)" if row["decoding"] != "ar" else ""
    return f"{row['speedup_vs_llama_cpp']:.2f}x{tpf}"


def peer_markdown(result: dict, img: str = "img/bench_llama_cpp_peer.png") -> str:
    """The markdown page: the summary table (speed-up vs llama.cpp per task and system), the
    detail table, definitions and the plot."""
    cfg = result["config"]
    systems = list(dict.fromkeys(r["system"] for r in result["results"]))
    tasks = {t["name"]: t for t in result["tasks"]}
    label = {s: f"`{s}`" + (" (default)" if s.endswith(result["default_mode"]) else "") for s in systems[1:]}
    title = {"q8_0": "The engine's int8 weights against llama.cpp's Q8_0 of the same checkpoint",
             "bf16": "The engine's bf16 weights against llama.cpp's bf16 file of the same checkpoint"}.get(
                 result.get("gguf_type", "f32"), "The engine against llama.cpp on the same weights")
    lines = [f"# {title}", "",
             "Generated by `wedlm bench --peer llama.cpp`; rerun the command below to regenerate this file and "
             "its plot.", "",
             f"- command: `{result['command']}`",
             f"- machine: {result['machine_line']}; llama-cpp-python {result['llama_cpp']}"
             + ("" if result.get("llama_cpp_buffers", "default") == "default" else f" ({result['llama_cpp_buffers']})"),
             f"- model: `{result['model']}` (written as a {_GGUF_WORDS[result.get('gguf_type', 'f32')]} GGUF file "
             f"for llama.cpp); engine forward: "
             f"{result['engine']['precision']}; {result['engine']['matmuls']}; window W={result['engine']['window_size']}",
             f"- batch 1, {cfg['threads']} thread(s) each, greedy, the same prompt token ids; whole-answer wall "
             f"clock from the call to the last token, prefill included; {cfg['repeats']} timed repeat(s) after an "
             f"untimed pass, systems rotated within a repeat; run took {result['elapsed_s']:.0f} s",
             f"- created: {result['created']}", "",
             "## Speed-up over llama.cpp AR (whole-answer wall clock)", "",
             "| task (prompts) | llama.cpp AR | " + " | ".join(label[s] for s in systems[1:]) + " | same answers |",
             "|---|---|" + "---|" * (len(systems) - 1) + "---|"]
    for name, task in tasks.items():
        rows = {r["system"]: r for r in result["results"] if r["task"] == name}
        same = min(r["same_as_llama_cpp"] for r in rows.values())
        lines.append(f"| {name} ({task['items']}) | 1.00 | " + " | ".join(_cell(rows[s]) for s in systems[1:])
                     + f" | {same}/{task['items']} |")
    lines += ["", "## Per system", "",
              "| task | system | answer tokens | wall ms (median) | tok/s | tok/forward | same as llama.cpp | "
              "x llama.cpp |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["results"]:
        lines.append(f"| {r['task']} | {r['system']} | {r['tokens']} | {1e3 * r['wall_s']:.1f} | "
                     f"{r['tokens_per_s']:.1f} | {r['tokens_per_forward']:.2f} | {r['same_as_llama_cpp']}/"
                     f"{r['items']} | {r['speedup_vs_llama_cpp']:.2f}x |")
    lines += ["", f"![speed-up over llama.cpp]({img})", "", "## Definitions", "",
              "- x llama.cpp: median over repeats of (llama.cpp's wall clock for the task's prompts) / (the "
              "system's), both measured in the same repeat; above 1 the engine is faster.",
              "- tok/forward: decoded tokens (a final stop token included) / decode forwards (1 for AR).",
              "- same answers: prompts whose answer token ids (trailing stop ids dropped) equal llama.cpp's, "
              "counted for the system that matches least; the summary's column.",
              "- `wedlm`: streaming parallel decoding (Algorithm 1); `verified`: drafts accepted only where they "
              "equal the greedy AR token (lossless); `ar`: the engine's one-token decoding; eager / compiled: the "
              "engine's forward (`enforce_eager`), (default) marking what `LLM(...)` runs without the option."]
    return "\n".join(lines) + "\n"


def peer_stem(result: dict) -> str:
    """The file stem of a result: llama_cpp_peer (float32 weights), llama_cpp_peer_q8_0 (8-bit),
    llama_cpp_peer_bf16."""
    gguf_type = result.get("gguf_type", "f32")
    return "llama_cpp_peer" if gguf_type == "f32" else f"llama_cpp_peer_{gguf_type}"


def write_peer(result: dict, out_dir: str | Path, plots: bool = True) -> dict[str, Path]:
    """Write STEM.json, STEM.md and (optionally) img/bench_STEM.png, STEM = `peer_stem(result)`: a
    float32 run and an 8-bit run keep separate pages."""
    from .report import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = peer_stem(result)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    write_json(result, paths["json"])
    paths["markdown"].write_text(peer_markdown(result, img=f"img/bench_{stem}.png"))
    if plots:
        from .plots import plot_peer

        paths["plot"] = out / "img" / f"bench_{stem}.png"
        paths["plot"].parent.mkdir(parents=True, exist_ok=True)
        plot_peer(result, paths["plot"])
    return paths
