"""`wedlm train --config FILE [--set key=value ...]`: run (or resume) one training stage.

Thin: parse the YAML into `TrainConfig`, check that its inputs exist (naming the command
that makes a missing one), call `wedlm.train.trainer.train`.
Launch data-parallel runs with `accelerate launch` or `torchrun`, e.g.
`accelerate launch --cpu --num_processes 2 -m wedlm.cli.main train --config FILE`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import yaml

from .options import UsageError, check_output

CURRICULUM_FILES = ("train.jsonl", "val.jsonl", "test.jsonl")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="run one training stage from a YAML config (AR, WeDLM, SFT)")
    p.add_argument("--config", required=True, help="YAML file (see configs/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (value parsed as YAML), repeatable")
    p.set_defaults(func=run)


def parse_overrides(items: list[str]) -> dict:
    """["max_steps=10", "lr=1.0e-3"] -> {"max_steps": 10, "lr": 0.001}.

    Values are parsed as YAML 1.1, so "lr=1e-3" gives the string "1e-3";
    `TrainConfig` reads such strings as numbers.

    Raises:
        ValueError: an item without "=", or a value that is not YAML.
    """
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ValueError(f"--set {item!r}: the value is not YAML ({err})") from None
    return out


def load_config(path: str, overrides: list[str]):
    """`TrainConfig` from the YAML file and the --set items.

    Raises:
        UsageError: a missing or unreadable file, bad YAML, an unknown key or a bad value.
    """
    from wedlm.train.config import TrainConfig

    if not Path(path).is_file():
        raise UsageError(f"--config {path}: no such file (the stage configs are in configs/)")
    try:
        return TrainConfig.from_yaml(path, parse_overrides(overrides))
    except (ValueError, TypeError, yaml.YAMLError) as err:
        message = str(err)
        raise UsageError(message if message.startswith(str(path)) else f"--config {path}: {message}") from None


def data_hint(data: Path) -> str:
    """The command that makes the missing data file `data`."""
    if data.name in CURRICULUM_FILES:
        return (f"make it with `python -m wedlm.data.curriculum --out {shlex.quote(str(data.parent))}` "
                "(add --scale 0.05 for a small one)")
    return "the recipes make their data files with `python -m wedlm.data.curriculum` (see recipes/wedlm_tiny.sh)"


def check_inputs(cfg) -> None:
    """Every file the stage reads exists and every folder it writes can be made: data (a JSONL
    file whose first record reads), tokenizer folder, init checkpoint, out_dir.

    Raises:
        UsageError: naming the key, the path, and how to make it.
    """
    from wedlm.jsonl import read_jsonl
    from wedlm.tokenizer import has_tokenizer_files

    data = Path(cfg.data)
    if not data.exists():
        raise UsageError(f"data: {data} does not exist; {data_hint(data)}")
    if not data.is_file():
        raise UsageError(f"data: {data} is not a file (a JSONL file, one JSON object per line)")
    try:
        read_jsonl(data, limit=1)
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise UsageError(f"data: {err} (a JSONL file, one JSON object per line)") from None
    if not Path(cfg.tokenizer).is_dir() or not has_tokenizer_files(cfg.tokenizer):
        raise UsageError(f"tokenizer: {cfg.tokenizer} is not a folder with tokenizer files (a model folder with "
                         "tokenizer.json, e.g. models/wedlm-tiny)")
    if cfg.init and not (Path(cfg.init) / "config.json").is_file():
        raise UsageError(f"init: {cfg.init} is not a checkpoint folder (no config.json); it is made by an "
                         "earlier stage (bash recipes/wedlm_tiny.sh runs them in order), or start from the "
                         "shipped model with --set init=models/wedlm-tiny")
    check_output(cfg.out_dir, "out_dir:", folder=True)


def run(args: argparse.Namespace) -> int:
    from wedlm.train.trainer import train

    cfg = load_config(args.config, args.set)
    check_inputs(cfg)
    final = train(cfg)
    print(f"final checkpoint: {final}")
    return 0
