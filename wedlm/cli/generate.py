"""`wedlm generate`: one completion from the command line, a thin wrapper over `LLM.generate`.

The engine and sampling options are the shared ones of `options.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .options import (add_engine_args, add_sampling_args, chat_prompt, format_stats, load_llm,
                      sampling_params_from_args)

EXAMPLES = """examples:
  wedlm generate "Count from 1 to 20:" --max-tokens 64 --temperature 0
  wedlm generate --file prompt.txt --decoding verified --json
  echo "Hi" | wedlm generate - --chat --threshold 0.6 --window-size 8
"""


def add_parser(subparsers: Any) -> None:
    """Register `wedlm generate`."""
    parser = subparsers.add_parser(
        "generate", help="generate a completion for one prompt",
        description="Generate a completion for one prompt (argument, file, or '-' for stdin) and print it.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", nargs="?", default=None, help="the prompt text, or '-' to read stdin")
    parser.add_argument("--file", "-f", type=Path, default=None, help="read the prompt from this file")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt as a user message in the model's chat template")
    parser.add_argument("--system", default=None, help="system message (with --chat)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: text, token_ids, finish_reason and stats")
    add_engine_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from the argument, `--file`, or stdin ('-')."""
    if args.file is not None and args.prompt is not None:
        raise ValueError("give the prompt as an argument or with --file, not both")
    if args.file is not None:
        return args.file.read_text()
    if args.prompt == "-":
        return sys.stdin.read()
    if args.prompt is None:
        raise ValueError("no prompt: pass it as an argument, with --file, or '-' for stdin")
    return args.prompt


def run(args: argparse.Namespace) -> int:
    """Generate and print; 2 on a usage error (bad prompt source or parameter)."""
    try:
        prompt = read_prompt(args)
        params = sampling_params_from_args(args)
    except (OSError, ValueError) as err:
        print(f"wedlm generate: error: {err}", file=sys.stderr)
        return 2
    llm = load_llm(args, "generate")
    if llm is None:
        return 2
    try:
        if args.chat:
            system = [{"role": "system", "content": args.system}] if args.system else []
            prompt = chat_prompt(llm.tokenizer, system + [{"role": "user", "content": prompt}])
        return print_json(llm, prompt, params) if args.json else print_stream(llm, prompt, params)
    except ValueError as err:
        print(f"wedlm generate: error: {err}", file=sys.stderr)
        return 2


def print_json(llm: Any, prompt: str, params: Any) -> int:
    """`--json`: one object with text, token_ids, finish_reason and stats."""
    result = llm.generate([prompt], params)[0]
    out = {key: result.get(key) for key in ("text", "token_ids", "finish_reason", "stats")}
    print(json.dumps(out, ensure_ascii=False))
    return 0


def print_stream(llm: Any, prompt: str, params: Any) -> int:
    """Print committed text as the engine yields it; stats go to stderr."""
    started = time.perf_counter()
    stats = None
    for delta in llm.generate_stream([prompt], params):
        sys.stdout.write(delta["new_text"])
        sys.stdout.flush()
        if delta["finished"]:
            stats = delta["stats"]
    sys.stdout.write("\n")
    print(f"[{format_stats(stats, time.perf_counter() - started)}]", file=sys.stderr)
    return 0
