"""`wedlm` entry point: one sub-command per module in `wedlm.cli`.

Each sub-command module defines `add_parser(subparsers)` (registering its parser
with `set_defaults(func=run)`) and `run(args) -> int`; the options they share are
defined once in `options.py`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .. import __version__
from . import bench, chat, convert, generate, lm_eval, serve, train
from . import eval as eval_command
from .options import (
    UsageError,
    default_model,  # noqa: F401  (re-exported: the shipped model's folder)
    resolve_model_arg,
)

COMMANDS = (generate, chat, serve, bench, eval_command, lm_eval, train, convert)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wedlm",
        description="Causal diffusion language models: generate, chat, serve, benchmark, evaluate, train, convert.")
    parser.add_argument("--version", action="version", version=f"wedlm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; its exit status: 0 done, 2 a user mistake (argparse's or a
    `UsageError`, reported on stderr), 130 interrupted by Ctrl-C, 141 (as for SIGPIPE) when
    stdout's reader closed the pipe (no traceback in any case)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    if not resolve_model_arg(args):
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"wedlm {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nwedlm {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`wedlm generate ... | head`): stop quietly
        # nothing more can reach it; pointing stdout at devnull keeps the interpreter's final flush
        # from raising again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
