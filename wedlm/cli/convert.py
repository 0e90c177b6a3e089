"""`wedlm convert SRC DST [--mask-token-id N]`: turn a Qwen2/Qwen3 AR checkpoint into a WeDLM one."""

from __future__ import annotations

import argparse

from .options import UsageError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="AR checkpoint (qwen2/qwen3) -> WeDLM checkpoint (weights untouched)")
    p.add_argument("src", help="AR checkpoint folder (config.json + safetensors + tokenizer)")
    p.add_argument("dst", help="output folder")
    p.add_argument("--mask-token-id", type=int, default=None,
                   help="[MASK] id (default: the tokenizer's <|mask|>, added if missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from wedlm.convert import ConvertError, convert

    if not Path(args.src).is_dir():
        raise UsageError(f"{args.src}: no such folder (expected an AR checkpoint folder: config.json, "
                         "safetensors weights, tokenizer)")

    try:
        out = convert(args.src, args.dst, args.mask_token_id)
    except (ConvertError, OSError) as err:
        raise UsageError(str(err)) from None
    print(f"wrote WeDLM checkpoint to {out}")
    return 0
