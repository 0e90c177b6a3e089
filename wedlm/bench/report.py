"""Bench results out: JSON, a markdown report with the target checks, and matplotlib plots.

What: `write_report(result, out_dir)` writes `benchmarks.json`, `benchmarks.md`
and `img/bench_*.png` (speed vs tau, accuracy vs speed with the Pareto frontier
as in the paper's Fig. 5a, p_cache by decoder, the decode trace of one
prompt). `targets(result)` checks the project's speed claims against a run.

Why: one command regenerates `docs/benchmarks.md` and its figures, so the
numbers in the docs always come with the exact command and machine line.
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA_KEYS = ("schema", "command", "created", "model", "machine", "machine_line", "stop_by_ar", "stop_in_run", "engine", "config",
               "systems", "tasks", "results", "trace", "elapsed_s")
RESULT_KEYS = ("task", "batch_size", "system", "kind", "decoding", "tau", "lam", "items",
               "tokens_per_s", "wall_s", "tokens_per_forward", "p_cache", "ttft_s", "decode_tokens",
               "decode_forwards", "accuracy", "repeats")
# The llama.cpp peer has its own page (`wedlm bench --peer llama.cpp`, wedlm/bench/peer.py); this
# report links it so that regenerating docs/benchmarks.md keeps the link.
PEER_SECTION = [
    "## Against llama.cpp on the same weights", "",
    "`wedlm bench --peer llama.cpp` runs llama.cpp's AR (llama-cpp-python, optional: `pip install "
    "llama-cpp-python gguf`) on the model written as a float32 GGUF file, beside the engine's `wedlm`, "
    "`verified` and `ar` (eager and compiled), at batch 1, one thread each, greedy, on the same prompt "
    "token ids, timing each whole answer (prefill included) and comparing the answers token for token. "
    "It writes [llama_cpp_peer.md](llama_cpp_peer.md) with its plot and llama_cpp_peer.json. With "
    "`--quantization int8` llama.cpp runs the model written in Q8_0, its own 8-bit format, beside the "
    "engine's int8 weights, and the page is [llama_cpp_peer_q8_0.md](llama_cpp_peer_q8_0.md):", "",
    "```bash",
    "wedlm bench --peer llama.cpp --out-dir docs   # not run by tests: minutes of timing; needs llama-cpp-python "
    "(tests/bench/test_llama_cpp_peer.py runs it on 2 prompts)",
    "wedlm bench --peer llama.cpp --quantization int8 --out-dir docs   # not run by tests: minutes of timing; "
    "needs llama-cpp-python (tests/bench/test_llama_cpp_peer.py runs it on 2 prompts)",
    "```", ""]
# Pages other commands generate next to benchmarks.md: (file, heading or None to go on under the
# section before, the command that writes it).
# Their first table is copied in when the page exists in the same folder, so that one page holds
# every comparison; the linked page keeps the details, plot and definitions.
COMPANION_PAGES = (
    ("llama_cpp_peer.md", None, "wedlm bench --peer llama.cpp --out-dir docs"),  # under PEER_SECTION's heading
    ("llama_cpp_peer_q8_0.md", "Int8 weights against llama.cpp's Q8_0",
     "wedlm bench --peer llama.cpp --quantization int8 --out-dir docs"),
    ("avx2/llama_cpp_peer.md", "On an AVX2-only CPU (AMD EPYC Zen 3): against llama.cpp",
     "wedlm bench --peer llama.cpp --out-dir docs/avx2"),
    ("avx2/llama_cpp_peer_q8_0.md", "On an AVX2-only CPU (AMD EPYC Zen 3): int8 weights against llama.cpp's Q8_0",
     "wedlm bench --peer llama.cpp --quantization int8 --out-dir docs/avx2"),
    ("zen1/llama_cpp_peer.md", "On an AVX2 CPU with 128-bit FMA units (AMD EPYC Zen 1): against llama.cpp",
     "wedlm bench --peer llama.cpp --out-dir docs/zen1"),
    ("zen1/llama_cpp_peer_q8_0.md",
     "On an AVX2 CPU with 128-bit FMA units (AMD EPYC Zen 1): int8 weights against llama.cpp's Q8_0",
     "wedlm bench --peer llama.cpp --quantization int8 --out-dir docs/zen1"),
    ("amx/llama_cpp_peer.md", "On an Intel Xeon with AMX: against llama.cpp",
     "wedlm bench --peer llama.cpp --out-dir docs/amx"),
    ("amx/llama_cpp_peer_q8_0.md", "On an Intel Xeon with AMX: int8 weights against llama.cpp's Q8_0",
     "wedlm bench --peer llama.cpp --quantization int8 --out-dir docs/amx"),
    ("real_model_speed.md", "A real pretrained model: SmolLM2-135M-Instruct, engine `ar` vs transformers vs llama.cpp",
     "python benchmarks/real_model_speed.py --out-dir docs"),
    ("structured_outputs.md", "Structured outputs: validity, accuracy and cost per decoder",
     "python benchmarks/structured_outputs.py --n 8 --out-dir docs"),
    ("replicas_speed.md", "Ray Serve replicas against one process",
     "python benchmarks/replicas_speed.py --out-dir docs"),
)
PLOTS = ("bench_speed_vs_tau.png", "bench_accuracy_vs_speed.png", "bench_p_cache.png", "bench_trace.png")


def rows(result: dict, task: str | None = None, batch_size: int | None = None, system: str | None = None):
    """Result rows filtered by task / batch size / system name."""
    return [r for r in result["results"] if (task is None or r["task"] == task)
            and (batch_size is None or r["batch_size"] == batch_size)
            and (system is None or r["system"] == system)]


def _one(result, task, b, system):
    found = rows(result, task, b, system)
    return found[0] if found else None


def _best_wedlm(result: dict, task: str, b: int, accuracy_slack: float | None = None) -> dict | None:
    """Fastest streaming row (vs ar); with `accuracy_slack`, only rows within it of ar's accuracy."""
    ar = _one(result, task, b, "ar")
    cands = [r for r in rows(result, task, b) if r["decoding"] == "wedlm" and r.get("speedup_vs_ar")]
    if accuracy_slack is not None and ar and ar["accuracy"] is not None:
        acc = {r["system"]: r["accuracy"] for r in rows(result, task, _acc_batch(result))}
        cands = [r for r in cands if acc.get(r["system"]) is not None
                 and acc[r["system"]] >= acc.get("ar", 0) - accuracy_slack]
    return max(cands, key=lambda r: r["speedup_vs_ar"], default=None)


def _at_tau(result: dict, task: str, b: int, decoding: str, tau: float) -> dict | None:
    """The row of `decoding` at threshold `tau` (the first lambda of the sweep for wedlm)."""
    lam = result["config"]["lambdas"][0]
    found = [r for r in rows(result, task, b) if r["decoding"] == decoding and r["tau"] == tau
             and (decoding != "wedlm" or r["lam"] == lam)]
    return found[0] if found else None


def _acc_batch(result: dict) -> int:
    return max(r["batch_size"] for r in result["results"])


def targets(result: dict) -> list[dict]:
    """The project's speed targets checked against this run, at batch size 1.

    Streaming claims are judged on the fastest wedlm setting whose accuracy (from the
    largest batch size's run, which has the most prompts) is within 2 points of ar's.
    Each entry: {claim, system, value, target, met, why}; value None when the run lacks the rows,
    and `why` then says which (else None).
    """
    b = min(r["batch_size"] for r in result["results"])
    out = []

    def add(claim, row, key, target, extra_ok=True, missing="the run has no such row"):
        value = row.get(key) if row else None
        out.append({"claim": claim, "system": row["system"] if row else None, "value": value,
                    "target": target, "met": bool(value is not None and value >= target and extra_ok),
                    "why": None if value is not None else missing if row is None else f"the row has no {key}"})

    near_ar = "no `wedlm` setting within 2 points of `ar`'s accuracy (or no such rows)"
    best = _best_wedlm(result, "counting", b, accuracy_slack=0.02)
    add("counting: wall clock vs ar", best, "wall_speedup_vs_ar", 6.0, missing=near_ar)
    add("counting: wall clock vs transformers generate", best, "wall_speedup_vs_transformers", 15.0, missing=near_ar)
    best = _best_wedlm(result, "arithmetic", b, accuracy_slack=0.02)
    add("arithmetic: wall clock vs ar, accuracy within 2 points", best, "wall_speedup_vs_ar", 2.5, missing=near_ar)
    for task in dict.fromkeys(r["task"] for r in result["results"]):
        stream = _at_tau(result, task, b, "wedlm", 0.9)
        block = _at_tau(result, task, b, "blockwise", 0.9)
        if stream is None or block is None:
            continue
        value = stream["tokens_per_s"] / block["tokens_per_s"] if block["tokens_per_s"] else None
        out.append({"claim": f"{task}: streaming vs blockwise at tau=0.9 (tok/s)", "system": stream["system"],
                    "value": value, "target": 1.9, "met": bool(value and value >= 1.9),
                    "why": None if value is not None else "blockwise made no tokens"})
    verified = _one(result, "counting", b, "verified")
    identical = bool(verified and verified.get("same_as_ar") == 1.0)
    add("counting: verified vs ar wall clock, identical output", verified, "wall_speedup_vs_ar", 2.0, identical)
    return out


def write_json(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def markdown(result: dict, img_dir: str = "img", out_dir: str | Path | None = None) -> str:
    """The whole markdown report (tables per batch size and task, targets, plots, the first table
    of each companion page found in `out_dir`, definitions)."""
    cfg = result["config"]
    lines = ["# Benchmarks", "",
             "Generated by `wedlm bench`; rerun the command below to regenerate this file and its plots.", "",
             f"- command: `{result['command']}`",
             f"- machine: {result['machine_line']}",
             *([f"- engine forward: {result['engine']['precision']}; {result['engine']['matmuls']}"
               + (f"; {result['engine']['forward']}" if "forward" in result["engine"] else "")]
               if result.get("engine") else []),
             f"- model: `{result['model']}`; greedy decoding; window W={cfg['window_size']}; "
             + ("`wedlm` rows with stops decided by the AR head (the model's `wedlm_stop_by_ar`"
                + (", and a stop that closes a run filled in one forward: `wedlm_stop_in_run`"
                   if result.get("stop_in_run") else "") + "); "
                if result.get("stop_by_ar") else "") +
             f"{cfg['repeats']} timed repeat(s) after a warm-up; run took {result['elapsed_s']:.0f} s",
             f"- created: {result['created']}", "",
             "## Targets", "",
             "| claim | system | measured | target | met |", "|---|---|---:|---:|:-:|"]
    for t in targets(result):
        measured = f"- ({t['why']})" if t["value"] is None else f"{_fmt(t['value'])}x"
        lines.append(f"| {t['claim']} | {t['system'] or '-'} | {measured} | {t['target']:g}x | "
                     f"{'yes' if t['met'] else 'no'} |")
    tasks = {t["name"]: t for t in result["tasks"]}
    for b in cfg["batch_sizes"]:
        lines += ["", f"## Batch size {b}", ""]
        for name, task in tasks.items():
            lines += [f"### {name} ({task['kind']}; {task['items'][str(b)]} prompts, max {task['max_tokens']} "
                      "new tokens)", "",
                      "| system | tok/s | tok/forward | p_cache | TTFT ms | accuracy | same as ar | x ar | "
                      "x transformers |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for r in rows(result, name, b):
                acc = _fmt(None if r["accuracy"] is None else 100 * r["accuracy"], ".1f")
                ttft = _fmt(None if r["ttft_s"] is None else 1000 * r["ttft_s"], ".0f")
                lines.append(f"| {r['system']} | {r['tokens_per_s']:.1f} | {r['tokens_per_forward']:.2f} | "
                             f"{r['p_cache']:.2f} | {ttft} | {acc} | {_fmt(r.get('same_as_ar'), '.2f')} | "
                             f"{_fmt(r.get('speedup_vs_ar'))} | {_fmt(r.get('speedup_vs_transformers'))} |")
            lines.append("")
    lines += _trace_lines(result)
    lines += ["## Plots", ""]
    for name, title in zip(PLOTS, ("Speed vs tau", "Accuracy vs speed (Pareto frontier, cf. paper Fig. 5a)",
                                   "p_cache by decoder", "Decode trace: tokens committed per step")):
        lines += [f"![{title}]({img_dir}/{name})", ""]
    lines += PEER_SECTION
    lines += companion_lines(out_dir)
    lines += ["## Definitions", "",
              "- tok/s: generated tokens / wall-clock seconds of the whole request batch (prefill included),"
              " median over repeats.",
              "- tok/forward: generated tokens / decode forwards (sum over requests).",
              "- p_cache: generated tokens / token instances fed in decode forwards (Eq. 4); 1 for AR.",
              "- TTFT: seconds from submission to the first committed token (mean over requests).",
              "- accuracy: exact match of the listing (counting, listops), final number (arithmetic); code and text"
              " are speed-only.",
              "- same as ar: share of prompts whose tokens equal the `ar` decoder's.",
              "- x ar, x transformers: median over repeats of the tok/s ratio to that system, measured"
              " back to back in the same repeat; the targets use the wall-clock ratio (same workload).",
              "- wedlm t=TAU l=LAMBDA: streaming parallel decoding (Algorithm 1) with entropy threshold tau"
              " and distance penalty lambda; blockwise: stop-and-wait blocks of W; verified: drafts"
              " accepted only where they equal the greedy AR token (lossless); transformers:"
              " `generate(do_sample=False)` on the same weights.",
              "- ceiling: in the steady state `wedlm` commits at most W/2 tokens per forward (a slot filled"
              " in one forward is committed in the next), `blockwise` up to W at the cost of recomputing"
              " its block (p_cache about 0.5); on answers the model is sure of, blockwise is therefore"
              " faster (docs/method.md, \"The ceiling\")."]
    return "\n".join(lines) + "\n"


def page_header(title: str, result: dict) -> list[str]:
    """The opening lines of a generated benchmark page: its title, the command that regenerates
    it, and the machine, date and versions (`result`'s `command`, `machine`, `date` and
    `versions`, a {package: version} dict)."""
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    return [f"# {title}", "", f"Regenerate with: `{result['command']}` (generated file; do not edit).", "",
            f"Machine: {result['machine']}. Date: {result['date']}. {versions}.", ""]


def first_table(markdown: str) -> list[str]:
    """The lines of the first markdown table in `markdown` (header, rule, rows); [] if none."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return []
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def companion_lines(out_dir: str | Path | None) -> list[str]:
    """A section per `COMPANION_PAGES` page present in `out_dir`: its first table, a link, the
    command that regenerates it. Empty without `out_dir`."""
    if out_dir is None:
        return []
    lines = []
    for name, heading, command in COMPANION_PAGES:
        page = Path(out_dir) / name
        table = first_table(page.read_text()) if page.is_file() else []
        if table:
            lines += ([f"## {heading}", ""] if heading else []) + [*table, "",
                      f"From [{name}]({name}) (details, plot and definitions there), written by `{command}`.", ""]
    return lines


def _trace_lines(result: dict) -> list[str]:
    """Steps and tokens per forward of each engine decoder on the trace prompt."""
    trace = result.get("trace")
    if not trace or not trace["commits"]:
        return []
    lines = [f"## Decode trace: {trace['prompt']!r} (batch size {trace['batch_size']})", "",
             "| system | tokens | forwards | tokens/forward | most in one step |", "|---|---:|---:|---:|---:|"]
    for name, commits in trace["commits"].items():
        if commits:
            lines.append(f"| {name} | {sum(commits)} | {len(commits)} | {sum(commits) / len(commits):.2f} | "
                         f"{max(commits)} |")
    return lines + [""]


def write_report(result: dict, out_dir: str | Path, plots: bool = True) -> dict[str, Path]:
    """Write benchmarks.json, benchmarks.md and (optionally) img/bench_*.png into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "benchmarks.json", "markdown": out / "benchmarks.md"}
    result = dict(result, targets=targets(result))
    write_json(result, paths["json"])
    paths["markdown"].write_text(markdown(result, out_dir=out))
    if plots:
        from .plots import write_plots

        paths.update(write_plots(result, out / "img"))
    return paths
