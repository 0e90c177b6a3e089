"""`wedlm bench`: every system on every task and batch size, timed pair by pair in one run.

What: `BenchConfig` (what to run), `bench_systems` (the decoder sweep),
`run_bench` (warm up, then for each repeat, task and batch size run all systems
back to back in a rotated order; score the first repeat; compute speed-ups
against `ar` and transformers repeat by repeat) -> a JSON-ready dict
(schema in `docs/benchmarks.md` and `report.SCHEMA_KEYS`).

Why: CPU timings drift with the machine's load, so a ratio is only trusted when
both sides ran within seconds of each other; the median of per-repeat ratios is
reported, never a ratio of medians taken at different times. Greedy decoding
makes every repeat produce the same tokens, so accuracy and same-output checks
come from the first repeat.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from statistics import median

from tqdm import tqdm

from wedlm.engine.defaults import DEFAULT_ENTROPY_THRESHOLD
from wedlm.evaluate.machine import machine_info, machine_line
from wedlm.evaluate.metrics import aggregate
from wedlm.evaluate.runner import cut_at_stops, render_prompts
from wedlm.evaluate.tasks import EvalTask

from .systems import EngineSystem, SystemSpec, TransformersSystem
from .tasks import BENCH_TASKS, bench_task

SCHEMA = "wedlm-bench/1"
# Items per task: (batch size 1, larger batch sizes). Accuracy is read from the larger run.
ITEMS = {"counting": (2, 8), "arithmetic": (8, 32), "listops": (8, 32), "code": (2, 8), "text": (2, 8)}
QUICK_ITEMS = {"counting": (1, 8), "arithmetic": (2, 8), "listops": (2, 8), "code": (1, 8), "text": (1, 8)}


@dataclass(slots=True)
class BenchConfig:
    """What one `wedlm bench` run measures.

    Attributes:
        model: checkpoint folder.
        tasks: subset of `BENCH_TASKS`.
        taus: WeDLM entropy thresholds swept at `lambdas[0]`.
        lambdas: distance penalties; the first is used for the tau sweep, the
            others are run at `lambda_tau`.
        blockwise_taus: thresholds for the block-wise (stop-and-wait) decoder.
        batch_sizes: e.g. (1, 8).
        items: per task (n at batch size 1, n at larger sizes); None = defaults.
        max_tokens: per-task budget override (None = `tasks.MAX_TOKENS`).
        repeats: timed repeats (after one warm-up).
        verified / transformers: include those systems.
        window_size: engine window W (None = the model's generation_config.json, else
            `defaults.DEFAULT_WINDOW`).
        prefix_caching: let the engine reuse prompt KV across requests. Off by default:
            repeats would otherwise skip prefill that the transformers peer recomputes.
        enforce_eager / autocast / quantization: the engine's forward path, bf16 autocast and int8
            matmuls (`wedlm.LLM`; the transformers peer stays float).
    """

    model: str
    tasks: tuple[str, ...] = BENCH_TASKS
    taus: tuple[float, ...] = (0.2, 0.4, 0.6, 0.9)
    lambdas: tuple[float, ...] = (0.02, 0.10)
    lambda_tau: float = DEFAULT_ENTROPY_THRESHOLD
    blockwise_taus: tuple[float, ...] = (0.4, 0.9)
    batch_sizes: tuple[int, ...] = (1, 8)
    items: dict[str, tuple[int, int]] | None = None
    max_tokens: int | None = None
    repeats: int = 3
    verified: bool = True
    transformers: bool = True
    window_size: int | None = None
    prefix_caching: bool = False
    enforce_eager: bool | None = None
    autocast: bool | None = None
    quantization: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    quick: bool = False
    trace_task: str = "counting"
    command: str = ""
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in BENCH_TASKS]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; expected some of {BENCH_TASKS}")
        if self.repeats < 1 or not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError("repeats and batch sizes must be >= 1")
        if not self.taus or not self.lambdas:
            raise ValueError("need at least one tau and one lambda")
        if self.items is None:
            self.items = dict(QUICK_ITEMS if self.quick else ITEMS)

    def n_items(self, task: str, batch_size: int) -> int:
        one, many = self.items.get(task, (1, batch_size))
        return one if batch_size == 1 else max(many, batch_size)


def bench_systems(cfg: BenchConfig) -> list[SystemSpec]:
    """The sweep: wedlm at each tau (lambda_0) and each other lambda (at lambda_tau),
    blockwise at each of its taus, verified, ar, then transformers."""
    specs = [SystemSpec("engine", "wedlm", t, cfg.lambdas[0]) for t in cfg.taus]
    specs += [SystemSpec("engine", "wedlm", cfg.lambda_tau, lam) for lam in cfg.lambdas[1:]]
    specs += [SystemSpec("engine", "blockwise", t, cfg.lambdas[0]) for t in cfg.blockwise_taus]
    if cfg.verified:
        specs.append(SystemSpec("engine", "verified"))
    specs.append(SystemSpec("engine", "ar"))
    if cfg.transformers:
        specs.append(SystemSpec("transformers"))
    return list(dict.fromkeys(specs))


def load_systems(cfg: BenchConfig, llm=None, hf=None) -> tuple[object, list]:
    """Build the engine `LLM` (unless given) and one system object per spec."""
    if llm is None:
        from wedlm import LLM

        llm = LLM(model=cfg.model, wedlm_window_size=cfg.window_size, max_num_seqs=max(cfg.batch_sizes),
                  device=cfg.device, dtype=cfg.dtype, enable_prefix_caching=cfg.prefix_caching,
                  enforce_eager=cfg.enforce_eager, autocast=cfg.autocast, quantization=cfg.quantization)
    if cfg.window_size is None:
        cfg.window_size = llm.engine.window_size  # the model's recommended W, recorded in the report
    systems = []
    for spec in bench_systems(cfg):
        if spec.kind == "engine":
            systems.append(EngineSystem(llm, spec, cfg.window_size))
        else:
            if hf is None:
                from wedlm.tokenizer import stop_token_ids

                hf = TransformersSystem(cfg.model, llm.tokenizer, stop_token_ids(llm.tokenizer, cfg.model),
                                        cfg.dtype, cfg.device)
            systems.append(hf)
    return llm, systems


def strip_stops(token_ids: list[int], stop_ids: set[int]) -> list[int]:
    """Token ids with trailing stop ids removed (engines differ in whether they report them)."""
    ids = list(token_ids)
    while ids and ids[-1] in stop_ids:
        ids.pop()
    return ids


def _run_cell(system, prompts: list[list[int]], batch_size: int, max_tokens: int) -> tuple[list[dict], float]:
    """All prompts through `system` in chunks of `batch_size`; (outputs, wall seconds)."""
    outputs, wall = [], 0.0
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        t0 = time.perf_counter()
        outputs += system.generate(chunk, max_tokens)
        wall += time.perf_counter() - t0
    return outputs, wall


def _score(task: EvalTask, outputs: list[dict]) -> float | None:
    if task.score is None:
        return None
    texts = [cut_at_stops(o["text"], task.stop) for o in outputs]
    return sum(task.score(item, t).correct for item, t in zip(task.items, texts)) / len(texts)


def _warm_up(systems: list, prompts: list[list[int]], batch_sizes: tuple[int, ...]) -> None:
    """One short generation per system at batch 1 and at each batch size (allocator, caches,
    lazy init, and every graph of the compiled forward: it compiles one per batch of 1 or more
    and one query per sequence or more, so a batch shrinking to one needs the batch-1 graphs)."""
    for system in systems:
        for b in sorted({1, *batch_sizes}):
            system.generate((prompts * b)[:b], 4)


def run_bench(cfg: BenchConfig, llm=None, hf=None) -> dict:
    """Run the whole benchmark; returns the result dict (see module docstring)."""
    t_start = time.perf_counter()
    llm, systems = load_systems(cfg, llm, hf)
    from wedlm.tokenizer import stop_token_ids

    stop_ids = set(stop_token_ids(llm.tokenizer, cfg.model))
    tasks = {name: bench_task(name, max(cfg.n_items(name, b) for b in cfg.batch_sizes), cfg.quick,
                              cfg.max_tokens) for name in cfg.tasks}
    prompts = {name: render_prompts(llm.tokenizer, t.items, chat=True) for name, t in tasks.items()}
    _warm_up(systems, prompts[cfg.tasks[0]][:1], cfg.batch_sizes)

    groups = [(name, b) for name in cfg.tasks for b in cfg.batch_sizes]
    cells: dict[tuple[str, int, str], dict] = {}
    bar = tqdm(total=cfg.repeats * len(groups) * len(systems), desc="bench", unit="run",
               disable=not cfg.progress)
    for rep in range(cfg.repeats):
        for g, (name, b) in enumerate(groups):
            n = cfg.n_items(name, b)
            order = systems[(rep + g) % len(systems):] + systems[:(rep + g) % len(systems)]
            for system in order:
                bar.set_postfix_str(f"{name} b={b} {system.name}")
                outputs, wall = _run_cell(system, prompts[name][:n], b, tasks[name].max_tokens)
                cell = cells.setdefault((name, b, system.name), {"runs": []})
                cell["runs"].append({"wall_s": wall, **_speed(outputs, wall)})
                if rep == 0:
                    cell["outputs"] = outputs
                bar.update(1)
    bar.close()
    results = [_result(cfg, tasks[name], b, system, cells, stop_ids)
               for name in cfg.tasks for b in cfg.batch_sizes for system in systems]
    info = machine_info(cfg.device)
    return {"schema": SCHEMA, "command": cfg.command,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "model": cfg.model, "machine": info, "machine_line": machine_line(info),
            "stop_by_ar": llm.decoding_defaults["wedlm_stop_by_ar"],  # what the wedlm rows decode with
            "stop_in_run": llm.decoding_defaults["wedlm_stop_in_run"],
            "engine": {"precision": llm.engine.precision, "matmuls": llm.engine.matmuls,
                       "forward": "eager" if llm.engine.enforce_eager else "compiled"},  # what the forward ran
            "config": _config_dict(cfg),
            "systems": [{"name": s.name, **asdict(s.spec)} for s in systems],
            "tasks": [{"name": t.name, "kind": t.kind, "max_tokens": t.max_tokens,
                       "scored": t.score is not None,
                       "items": {str(b): cfg.n_items(t.name, b) for b in cfg.batch_sizes}}
                      for t in tasks.values()],
            "results": results, "trace": _trace(cfg, tasks, cells, systems),
            "elapsed_s": time.perf_counter() - t_start}


def _speed(outputs: list[dict], wall: float) -> dict:
    row = aggregate([o["stats"] for o in outputs], wall)
    return {"tokens_per_s": row["tokens_per_s"], "decode_tokens": row["decode_tokens"]}


def _result(cfg: BenchConfig, task: EvalTask, b: int, system, cells: dict, stop_ids: set[int]) -> dict:
    """One (task, batch size, system) row with medians, accuracy, same-output and speed-ups."""
    cell = cells[(task.name, b, system.name)]
    outputs = cell["outputs"]
    runs = cell["runs"]
    mid = sorted(range(len(runs)), key=lambda r: runs[r]["wall_s"])[len(runs) // 2]
    metrics = aggregate([o["stats"] for o in outputs], runs[mid]["wall_s"])
    n = len(outputs)
    row = {"task": task.name, "batch_size": b, "system": system.name, **asdict(system.spec),
           "items": n, **metrics, "tokens_per_s": median(r["tokens_per_s"] for r in runs),
           "wall_s": median(r["wall_s"] for r in runs),
           "accuracy": _score(task, outputs), "finish_reasons": _count(o.get("finish_reason") for o in outputs),
           "repeats": runs, "sample": outputs[0]["text"][:300]}
    for ref in ("ar", "transformers"):
        key = (task.name, b, ref)
        if key not in cells:
            continue
        ref_cell = cells[key]
        ref_ids = [strip_stops(o["token_ids"], stop_ids) for o in ref_cell["outputs"]]
        ids = [strip_stops(o["token_ids"], stop_ids) for o in outputs]
        row[f"same_as_{ref}"] = sum(a == r for a, r in zip(ids, ref_ids)) / n
        pairs = list(zip(runs, ref_cell["runs"]))
        row[f"speedup_vs_{ref}"] = median(s["tokens_per_s"] / r["tokens_per_s"] for s, r in pairs
                                          if r["tokens_per_s"] > 0) if pairs else None
        row[f"wall_speedup_vs_{ref}"] = median(r["wall_s"] / s["wall_s"] for s, r in pairs if s["wall_s"] > 0)
    return row


def _count(values) -> dict:
    out: dict = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _trace(cfg: BenchConfig, tasks: dict, cells: dict, systems: list) -> dict | None:
    """Tokens committed per decode step for the first prompt of `trace_task` at batch size 1."""
    name = cfg.trace_task if cfg.trace_task in tasks else cfg.tasks[0]
    b = 1 if 1 in cfg.batch_sizes else cfg.batch_sizes[0]
    per_system = {s.name: cells[(name, b, s.name)]["outputs"][0]["stats"].get("commits", [])
                  for s in systems if s.spec.kind == "engine"}
    return {"task": name, "batch_size": b, "prompt": tasks[name].items[0].messages[-1]["content"],
            "commits": per_system}


def _config_dict(cfg: BenchConfig) -> dict:
    out = asdict(cfg)
    out.pop("progress", None)
    return json.loads(json.dumps(out))  # tuples -> lists: the dict equals its JSON round trip
