"""`wedlm train --config FILE [--set key=value ...]`: run (or resume) one training stage.

Thin: parse the YAML into `TrainConfig`, call `wedlm.train.trainer.train`.
Launch data-parallel runs with `accelerate launch` or `torchrun`, e.g.
`accelerate launch --cpu --num_processes 2 -m wedlm.cli.main train --config FILE`.
"""

from __future__ import annotations

import argparse

import yaml


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
        ValueError: an item without "=".
    """
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def run(args: argparse.Namespace) -> int:
    from wedlm.train.config import TrainConfig
    from wedlm.train.trainer import train

    cfg = TrainConfig.from_yaml(args.config, parse_overrides(args.set))
    final = train(cfg)
    print(f"final checkpoint: {final}")
    return 0
