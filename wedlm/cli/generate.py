"""`wedlm generate`: one completion from the command line, a thin wrapper over `LLM.generate`.

Also home of the engine and sampling options shared by `wedlm chat` and `wedlm serve`
(`add_engine_args`, `add_sampling_args`, `build_llm`, `sampling_params_from_args`), so
every command spells the knobs the same way: `--decoding`, `--window-size` (W),
`--threshold` (tau), `--penalty` (lambda), docs/method.md "Streaming parallel decoding". Options left unset
keep the library's defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..engine.defaults import DECODERS, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY
from .main import default_model

EXAMPLES = """examples:
  wedlm generate "Count from 1 to 20:" --max-tokens 64 --temperature 0
  wedlm generate --file prompt.txt --decoding verified --json
  echo "Hi" | wedlm generate - --chat --threshold 0.6 --window-size 8
"""


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Options that build the `LLM` (model folder, device, limits, window)."""
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=default_model(),
                       help="model folder (HF config.json + safetensors + tokenizer); default: the shipped %(default)s")
    group.add_argument("--window-size", type=int, default=None, metavar="W",
                       help="WeDLM decoding window W (slots decoded in parallel); default: the engine's (16)")
    group.add_argument("--max-model-len", type=int, default=None, metavar="N",
                       help="context length (prompt + generated tokens); default: the model's")
    group.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                       help="most requests in one continuous batch; default: the engine's")
    group.add_argument("--kv-block-size", type=int, default=None, metavar="N",
                       help="tokens per paged KV-cache block; default: the engine's")
    group.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)")
    group.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                       help="weights and activations dtype (default: %(default)s)")
    group.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                       help="split the weights across N ranks (N GPUs from --device's index, or N CPU "
                            "processes); default: 1")


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int | None = None) -> None:
    """Options that build the `SamplingParams` of each request."""
    group = parser.add_argument_group("sampling and decoding")
    group.add_argument("--decoding", choices=DECODERS, default=None,
                       help="decoding strategy: wedlm (streaming parallel, default), ar (one token per forward), "
                            "blockwise (stop-and-wait blocks), verified (lossless, equals ar when greedy)")
    group.add_argument("--threshold", type=float, default=None, metavar="TAU",
                       help="entropy threshold tau: masks with distance-adjusted entropy below it are filled each "
                            "step (higher = more tokens per forward); "
                            f"default: the model's or {DEFAULT_ENTROPY_THRESHOLD}")
    group.add_argument("--penalty", type=float, default=None, metavar="LAMBDA",
                       help="position penalty lambda added per slot of distance from the leftmost mask; "
                            f"default: the model's or {DEFAULT_POS_PENALTY}")
    group.add_argument("--temperature", type=float, default=None,
                       help="0 = greedy; default: the library's (0.2)")
    group.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]")
    group.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (0 = off)")
    group.add_argument("--max-tokens", type=int, default=max_tokens,
                       help="most tokens to generate" + (" (default: %(default)s)" if max_tokens else
                                                          "; default: the library's (64)"))
    group.add_argument("--stop", action="append", default=None, metavar="TEXT",
                       help="stop string (repeatable); the text ends before it")
    group.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    group.add_argument("--ignore-eos", action="store_true", help="keep generating past the model's stop tokens")


def build_llm(args: argparse.Namespace) -> Any:
    """`wedlm.LLM` from the engine options; unset ones keep the engine's defaults."""
    from wedlm import LLM

    kwargs: dict[str, Any] = {"model": args.model, "device": args.device, "dtype": args.dtype}
    optional = {"wedlm_window_size": args.window_size, "max_model_len": args.max_model_len,
                "max_num_seqs": args.max_num_seqs, "kv_block_size": args.kv_block_size,
                "tensor_parallel_size": args.tensor_parallel_size}
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    return LLM(**kwargs)


def load_llm(args: argparse.Namespace, command: str) -> Any | None:
    """`build_llm`, or None after printing `wedlm COMMAND: error: ...` for a missing or bad
    model folder or a bad engine option (no traceback)."""
    from wedlm.model.loader import CheckpointError

    try:
        return build_llm(args)
    except (OSError, ValueError, CheckpointError) as err:
        print(f"wedlm {command}: error: {err}", file=sys.stderr)
        return None


def sampling_params_from_args(args: argparse.Namespace) -> Any:
    """`wedlm.SamplingParams` from the sampling options (ValueError names a bad field)."""
    from wedlm import SamplingParams

    fields = {"decoding": args.decoding, "wedlm_entropy_threshold": args.threshold,
              "wedlm_pos_penalty_factor": args.penalty, "temperature": args.temperature,
              "top_p": args.top_p, "top_k": args.top_k, "max_tokens": args.max_tokens,
              "stop": args.stop, "seed": args.seed}
    kwargs = {k: v for k, v in fields.items() if v is not None}
    if args.ignore_eos:
        kwargs["ignore_eos"] = True
    return SamplingParams(**kwargs)


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat template applied to `messages`, ending with the assistant's turn
    header; message text never becomes control tokens (`wedlm.engine.chat.encode_chat`).

    Raises:
        ValueError: the model folder has no tokenizer or no chat template, or the template
            cannot render a message.
    """
    from wedlm.engine.chat import encode_chat

    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model folder has no tokenizer chat template; drop --chat or add one")
    return encode_chat(tokenizer, messages)


def format_stats(stats: dict | None, seconds: float | None = None) -> str:
    """One line: tokens, forwards, tokens/forward, p_cache and tok/s of a finished request."""
    stats = stats or {}
    tokens = stats.get("decode_tokens", 0)
    line = (f"{tokens} tokens · {stats.get('decode_forwards', 0)} forwards · "
            f"{stats.get('tokens_per_forward', 0.0):.2f} tokens/forward · p_cache {stats.get('p_cache', 0.0):.3f}")
    if seconds:
        line += f" · {tokens / seconds:.1f} tok/s"
    return line


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
