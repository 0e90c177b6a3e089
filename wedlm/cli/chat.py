"""`wedlm chat`: an interactive multi-turn chat in the terminal.

Each turn goes through the model's chat template with the whole conversation so far,
streams the answer as the engine commits it (`LLM.generate_stream`), and ends with one
line of numbers: tokens, decode forwards, tokens per forward, p_cache and tok/s. On a
colour terminal the text each decode step committed gets its own background, so the
parallel commits are visible. Commands: /reset, /system TEXT, /help, /exit.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, TextIO

from .options import (
    add_engine_args,
    add_sampling_args,
    chat_prompt,
    format_stats,
    load_llm,
    sampling_params_from_args,
)

HELP = "commands: /reset (forget the conversation), /system TEXT (set the system message), /help, /exit"
COLOURS = (44, 42, 45, 46, 43, 41)  # ANSI backgrounds cycled per decode step


def add_parser(subparsers: Any) -> None:
    """Register `wedlm chat`."""
    parser = subparsers.add_parser(
        "chat", help="interactive multi-turn chat with streamed answers",
        description="Chat with a model in the terminal. Answers stream as they are committed; each ends with "
                    "tokens/forward and tok/s. " + HELP + ". End with /exit or Ctrl-D.")
    parser.add_argument("--system", default=None, help="system message for the conversation")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour each decode step's text (default: auto = when stdout is a terminal)")
    add_engine_args(parser)
    add_sampling_args(parser, max_tokens=256)
    parser.set_defaults(func=run)


class ChatSession:
    """A conversation over one `LLM`.

    Args:
        llm: the engine.
        params: `SamplingParams` of every answer.
        out: where answers and stats are written.
        colour: wrap each decode step's text in an ANSI background colour.
    """

    def __init__(self, llm: Any, params: Any, out: TextIO, system: str | None = None, colour: bool = False):
        self.llm, self.params, self.out, self.colour = llm, params, out, colour
        self.system = system
        self.turns: list[dict[str, str]] = []

    def messages(self) -> list[dict[str, str]]:
        """System message (if any) plus every turn so far."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def command(self, line: str) -> bool:
        """Handle a /command; False when the session should end."""
        name, _, rest = line.partition(" ")
        if name in ("/exit", "/quit"):
            return False
        if name == "/reset":
            self.turns = []
            self.out.write("(conversation cleared)\n")
        elif name == "/system":
            self.system = rest.strip() or None
            self.out.write(f"(system message {'set' if self.system else 'cleared'})\n")
        else:
            self.out.write(HELP + "\n")
        return True

    def answer(self, user: str) -> str:
        """Stream the answer to `user`, print its stats line, keep both turns."""
        self.turns.append({"role": "user", "content": user})
        started = time.perf_counter()
        text, stats = "", None
        try:
            prompt = chat_prompt(self.llm.tokenizer, self.messages())
            for delta in self.llm.generate_stream([prompt], self.params):
                self.out.write(self.paint(delta["new_text"], delta["step_index"]))
                self.out.flush()
                text += delta["new_text"]
                if delta["finished"]:
                    stats = delta["stats"]
        except ValueError as err:  # e.g. the conversation outgrew the context (max_tokens no longer fits)
            self.turns.pop()
            self.out.write(f"error: {err} (try /reset)\n")
            return ""
        self.turns.append({"role": "assistant", "content": text})
        self.out.write(f"\n[{format_stats(stats, time.perf_counter() - started)}]\n")
        return text

    def paint(self, text: str, step: int) -> str:
        """`text` with the background colour of decode step `step` (when colouring)."""
        if not self.colour or not text:
            return text
        return f"\x1b[{COLOURS[step % len(COLOURS)]};97m{text}\x1b[0m"


def repl(session: ChatSession, read: Callable[[str], str]) -> int:
    """Read lines until /exit or end of input; answer each one."""
    session.out.write(f"wedlm chat: {HELP}\n")
    while True:
        try:
            line = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            session.out.write("\n")
            return 0
        if not line:
            continue
        if line.startswith("/"):
            if not session.command(line):
                return 0
            continue
        session.out.write("assistant> ")
        session.answer(line)


def run(args: argparse.Namespace) -> int:
    """Start the chat; 2 on a bad sampling option."""
    try:
        params = sampling_params_from_args(args)
    except ValueError as err:
        print(f"wedlm chat: error: {err}", file=sys.stderr)
        return 2
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    llm = load_llm(args, "chat")
    if llm is None:
        return 2
    session = ChatSession(llm, params, sys.stdout, system=args.system, colour=colour)
    return repl(session, input)
