"""`wedlm generate`: one completion from the command line, a thin wrapper over `LLM.generate`.

The engine and sampling options are the shared ones of `options.py`. The prompt goes to
the model as raw text, or through its chat template with `--chat`; a model folder whose
generation_config.json says `"wedlm_chat_only": true` (it was trained on chat-formatted
prompts only) gets the template unless `--no-chat` / `--raw` asks for the raw text.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .options import (
    UsageError,
    add_engine_args,
    add_sampling_args,
    chat_prompt,
    fit_budget,
    format_stats,
    load_llm,
    prompt_defaults,
    sampling_params_from_args,
    stop_note,
)
from .structured import add_structured_args, with_structured

EXAMPLES = """examples:
  wedlm generate --chat "Count from 1 to 20." --temperature 0
  wedlm generate --chat "What is 47 + 38?" --decoding verified --json
  wedlm generate --chat "Count from 1 to 5." --temperature 0 --regex "\\d+(, \\d+)*"
  echo "Reverse the list: Mia, Ben, Sam." | wedlm generate - --chat --threshold 0.6 --window-size 8
  wedlm generate --chat "What is 47 + 38?" --temperature 0 --logprobs 2
"""
EMPTY_HINT = ("[no output: this model answers chat-formatted prompts; add --chat to wrap the prompt "
              "in its chat template]")


def add_parser(subparsers: Any) -> None:
    """Register `wedlm generate`."""
    parser = subparsers.add_parser(
        "generate", help="generate a completion for one prompt",
        description="Generate a completion for one prompt (argument, file, or '-' for stdin) and print it. "
                    "The text goes to stdout; the stats line, and [stopped: max tokens N] when the answer "
                    "was cut at the budget, to stderr.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", nargs="?", default=None, help="the prompt text, or '-' to read stdin")
    parser.add_argument("--file", "-f", type=Path, default=None, help="read the prompt from this file")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="wrap the prompt as a user message in the model's chat template (--no-chat: "
                             "raw text); default: --chat when the model folder's generation_config.json says "
                             "wedlm_chat_only, else raw")
    parser.add_argument("--raw", dest="chat", action="store_false", help="the same as --no-chat")
    parser.add_argument("--system", default=None, help="system message (needs the chat template: --chat)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: text, token_ids, finish_reason and stats (and logprobs)")
    parser.add_argument("--logprobs", type=int, default=None, metavar="K",
                        help="K in [0, 20]: print each generated token's log-probability and its K most likely "
                             "alternatives (on stderr after the text; in the object with --json)")
    add_engine_args(parser, one_answer=True)
    add_sampling_args(parser)
    add_structured_args(parser)
    parser.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from the argument, `--file`, or stdin ('-'); an empty one is refused (with
    --chat it would still make a prompt, the template's, and answer a question nobody asked)."""
    if args.file is not None and args.prompt is not None:
        raise ValueError("give the prompt as an argument or with --file, not both")
    if args.file is not None:
        try:
            prompt, source = args.file.read_text(), str(args.file)
        except (OSError, UnicodeDecodeError) as err:
            why = err.strerror if isinstance(err, OSError) else f"not UTF-8: {err.reason}"
            raise ValueError(f"--file {args.file}: cannot read it as text ({why})") from err
    elif args.prompt == "-":
        prompt, source = sys.stdin.read(), "stdin"
    elif args.prompt is None:
        raise ValueError("no prompt: pass it as an argument, with --file, or '-' for stdin")
    else:
        prompt, source = args.prompt, "the argument"
    if not prompt:
        raise ValueError(f"prompt is empty ({source})")
    return prompt


def use_chat(args: argparse.Namespace, tokenizer: Any) -> bool:
    """--chat / --no-chat as given; unset: the template when the model is chat-only and has one."""
    if args.chat is not None:
        return args.chat
    return prompt_defaults(args.model)["wedlm_chat_only"] and bool(getattr(tokenizer, "chat_template", None))


def run(args: argparse.Namespace) -> int:
    """Generate and print; 2 on a usage error (bad prompt source or parameter)."""
    try:
        prompt = read_prompt(args)
        params = with_structured(args, sampling_params_from_args(args))
    except (OSError, ValueError) as err:
        raise UsageError(str(err)) from None
    llm = load_llm(args, "generate")
    if llm is None:
        return 2
    try:
        chat = use_chat(args, llm.tokenizer)
        if args.system is not None and not chat:  # dropping it silently would answer another question
            raise ValueError("--system needs the chat template (--chat); the raw prompt has no system message")
        if chat:
            system = [{"role": "system", "content": args.system}] if args.system else []
            ids = chat_prompt(llm.tokenizer, system + [{"role": "user", "content": prompt}])
        else:  # tokenized as the engine tokenizes a string prompt, to size the budget
            ids = llm.tokenizer.encode(prompt, add_special_tokens=False) if llm.tokenizer else prompt
        if isinstance(ids, list):
            params = fit_budget(llm, ids, params, explicit=args.max_tokens is not None)
        result = print_json(llm, ids, params) if args.json else print_stream(llm, ids, params)
    except ValueError as err:
        raise UsageError(str(err)) from None
    notes = [stop_note(result["finish_reason"], params.max_tokens)]
    if not chat and not result["text"].strip() and getattr(llm.tokenizer, "chat_template", None):
        notes.append(EMPTY_HINT)
    for note in filter(None, notes):
        print(note, file=sys.stderr)
    return 0


def print_json(llm: Any, prompt: Any, params: Any) -> dict:
    """`--json`: one object with text, token_ids, finish_reason and stats (and `logprobs`: per token
    {"token_id", "logprob", "top": [[id, logprob], ...]}); returns the result."""
    result = llm.generate([prompt], params)[0]
    out = {key: result.get(key) for key in ("text", "token_ids", "finish_reason", "stats")}
    if "logprobs" in result:
        out["logprobs"] = [lp.to_dict() for lp in result["logprobs"]]
    print(json.dumps(out, ensure_ascii=False))
    return result


def print_logprobs(tokenizer: Any, logprobs: list) -> None:
    """One stderr line per generated token: its text, log-probability and the top alternatives."""
    def show(token_id: int) -> str:
        return repr(tokenizer.decode([token_id])) if tokenizer is not None else str(token_id)

    for lp in logprobs:
        top = ", ".join(f"{show(t)} {v:.4f}" for t, v in lp.top)
        print(f"{show(lp.token_id)}\t{lp.logprob:.4f}" + (f"\ttop: {top}" if top else ""), file=sys.stderr)


def print_stream(llm: Any, prompt: Any, params: Any) -> dict:
    """Print committed text as the engine yields it; stats go to stderr. Returns
    {"text", "finish_reason"} of the answer."""
    started = time.perf_counter()
    stats, text, finish, logprobs = None, "", None, []
    for delta in llm.generate_stream([prompt], params):
        sys.stdout.write(delta["new_text"])
        sys.stdout.flush()
        text += delta["new_text"]
        logprobs += delta["logprobs"] or []
        if delta["finished"]:
            stats, finish = delta["stats"], delta["finish_reason"]
    sys.stdout.write("\n")
    sys.stdout.flush()
    if params.logprobs is not None:
        print_logprobs(llm.tokenizer, logprobs)
    print(f"[{format_stats(stats, time.perf_counter() - started)}]", file=sys.stderr)
    return {"text": text, "finish_reason": finish}
