"""`wedlm lm-eval ARGS...`: lm-evaluation-harness's own command line with the `wedlm` model registered.

lm-eval 0.4 finds models only in modules it has imported, so this command
imports `wedlm.evaluate.lm_eval_model` (which registers `wedlm`) and then runs
the harness's command line with exactly ARGS: every harness option
(`--include_path`, `--log_samples`, `--limit`, `--apply_chat_template`,
`--output_path`, ...) works unchanged.
"""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  wedlm lm-eval --model wedlm --model_args pretrained=models/wedlm-tiny,decoding=wedlm --device cpu \\
                --tasks my_task --include_path my_tasks/ --log_samples --output_path out/   # not run by tests: needs a task folder my_tasks/
  wedlm lm-eval --model wedlm --model_args pretrained=/models/WeDLM-8B-Instruct,decoding=wedlm,\\
wedlm_entropy_threshold=0.4,wedlm_window_size=16 --tasks gsm8k --device cuda   # not run by tests: needs a GPU and the network
  wedlm lm-eval ls tasks
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    # prefix_chars that no argument starts with: every ARG, "--help" included, reaches the harness.
    p = subparsers.add_parser(
        "lm-eval", help="run lm-evaluation-harness with the `wedlm` model (needs the eval extra)",
        description="lm-evaluation-harness's command line with `--model wedlm` available.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        prefix_chars="\0", add_help=False)
    p.add_argument("harness_args", nargs=argparse.REMAINDER, help="arguments for lm-eval, passed unchanged")
    p.set_defaults(func=run)
    return p


def run_harness(harness_args: list[str]) -> int:
    """Register the `wedlm` model and run lm-eval's command line on `harness_args`.

    Returns:
        the harness's exit status (0 on success).

    Raises:
        SystemExit: lm-eval is not installed (names the extra to install).
    """
    try:
        from lm_eval.__main__ import cli_evaluate
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] == "lm_eval":
            raise SystemExit("wedlm lm-eval: lm-evaluation-harness is not installed; "
                             "run `pip install -e .[eval]` (or `pip install lm-eval`)") from None
        raise
    import wedlm.evaluate.lm_eval_model  # noqa: F401  (registers `wedlm`)

    saved = sys.argv
    sys.argv = ["lm-eval", *harness_args]  # the harness reads sys.argv itself
    try:
        cli_evaluate()
    except ValueError as err:  # the harness's word for a user mistake, e.g. "Tasks not found: ..."
        print(f"wedlm lm-eval: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def run(args: argparse.Namespace) -> int:
    return run_harness(list(args.harness_args))
