"""`wedlm convert SRC DST [--mask-token-id N]`: turn an AR checkpoint (Qwen2/Qwen3/Llama/Mistral)
into a WeDLM one."""

from __future__ import annotations

import argparse

from .options import UsageError, add_revision_arg


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="AR checkpoint (qwen2/qwen3/llama/mistral) -> WeDLM checkpoint")
    p.add_argument("src", help="AR checkpoint folder (config.json + safetensors + tokenizer), .gguf file or hub id")
    p.add_argument("dst", help="output folder")
    p.add_argument("--mask-token-id", type=int, default=None,
                   help="[MASK] id (default: the tokenizer's <|mask|>, added if missing)")
    add_revision_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wedlm.convert import convert

    try:
        out = convert(args.src, args.dst, args.mask_token_id, revision=args.revision)
    except (OSError, ValueError) as err:  # ConvertError, ConfigError, ModelSourceError, FileNotFoundError
        raise UsageError(str(err)) from None
    print(f"wrote WeDLM checkpoint to {out}")
    return 0
