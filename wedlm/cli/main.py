"""`wedlm` entry point: one sub-command per module in `wedlm.cli`.

Each sub-command module defines `add_parser(subparsers)` (registering its parser
with `set_defaults(func=run)`) and `run(args) -> int`. Modules are imported only
when present so the command line works while features land one by one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

COMMANDS = ("generate", "chat", "serve", "bench", "eval", "lm_eval", "train", "convert")
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"


def default_model() -> str:
    """The shipped tiny WeDLM model (models/wedlm-tiny in the repository)."""
    return str(DEFAULT_MODEL)


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --threads, shared by the measuring commands (bench, eval)."""
    parser.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's; 1 is fastest on a busy machine)")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count from --threads when given."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wedlm",
        description="Causal diffusion language models: generate, chat, serve, benchmark, evaluate, train, convert.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"wedlm.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"wedlm.cli.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
