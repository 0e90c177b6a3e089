"""`wedlm chat`: an interactive chat in the terminal.

Each turn goes through the model's chat template with the whole conversation so far,
streams the answer as the engine commits it (`LLM.generate_stream`), and ends with one
line of numbers: tokens, decode forwards, tokens per forward, p_cache and tok/s. On a
colour terminal the text each decode step committed gets its own background, so the
parallel commits are visible. Commands: /reset, /system TEXT, /help, /exit.

A model folder whose generation_config.json says `"wedlm_single_turn": true` was trained
on one user turn only: every message then starts a fresh conversation (the system message
stays), and the chat says so once. Ctrl-C while an answer streams stops that answer (the
engine aborts the request and frees its KV blocks) and returns to the prompt with the
conversation as it was before the question; Ctrl-C or Ctrl-D at the prompt ends the chat.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from .options import (
    UsageError,
    add_engine_args,
    add_sampling_args,
    chat_prompt,
    deferred_interrupt,
    fit_budget,
    format_stats,
    load_llm,
    prompt_defaults,
    sampling_params_from_args,
    stop_note,
)

HELP = "commands: /reset (forget the conversation), /system TEXT (set the system message), /help, /exit"
SINGLE_TURN_NOTE = ("(this model was trained on single questions: every message starts a fresh "
                    "conversation; earlier turns are not sent)")
COLOURS = (44, 42, 45, 46, 43, 41)  # ANSI backgrounds cycled per decode step


def add_parser(subparsers: Any) -> None:
    """Register `wedlm chat`."""
    parser = subparsers.add_parser(
        "chat", help="interactive chat with streamed answers",
        description="Chat with a model in the terminal. Answers stream as they are committed; each ends with "
                    "tokens/forward and tok/s. " + HELP + ". Ctrl-C stops an answer; Ctrl-C or Ctrl-D at "
                    "the prompt (or /exit) ends the chat.")
    parser.add_argument("--system", default=None, help="system message for the conversation")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour each decode step's text (default: auto = when stdout is a terminal)")
    add_engine_args(parser, one_answer=True)
    add_sampling_args(parser)
    parser.set_defaults(func=run)


class ChatSession:
    """A conversation over one `LLM`.

    Args:
        llm: the engine.
        params: `SamplingParams` of every answer.
        out: where answers and stats are written.
        system: the system message (None: none).
        colour: wrap each decode step's text in an ANSI background colour.
        single_turn: send only the current question (and the system message) each turn.
        fit_context: shrink `params.max_tokens` to what the context has left when it does not fit
            (for a budget the user did not set).
        err: where notes go (a cut answer, an interrupted one).
    """

    def __init__(self, llm: Any, params: Any, out: TextIO, system: str | None = None, colour: bool = False,
                 single_turn: bool = False, fit_context: bool = False, err: TextIO | None = None):
        self.llm, self.params, self.out, self.colour = llm, params, out, colour
        self.system = system
        self.single_turn, self.fit_context = single_turn, fit_context
        self.err = err if err is not None else sys.stderr
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
        elif name == "/help":
            self.out.write(HELP + "\n")
        else:  # a typo must not look like it did something
            self.out.write(f"unknown command {name}; {HELP}\n")
        return True

    def answer(self, user: str) -> str:
        """Stream the answer to `user`, print its stats line, keep both turns.

        Ctrl-C while it streams aborts the request (its KV blocks are freed) and leaves the
        conversation as it was before `user`; returns the text so far then.
        """
        if self.single_turn:
            self.turns = []
        self.turns.append({"role": "user", "content": user})
        try:
            prompt = chat_prompt(self.llm.tokenizer, self.messages())
            params = fit_budget(self.llm, prompt, self.params, explicit=not self.fit_context)
            text, finish, stats, seconds = self.stream(prompt, params)
        except ValueError as err:  # e.g. the conversation outgrew the context (max_tokens no longer fits)
            self.turns.pop()
            self.out.write(f"error: {err} (try /reset)\n")
            return ""
        if finish is None:  # interrupted
            self.turns.pop()
            self.out.write("\n")
            self.out.flush()
            self.err.write("[interrupted: answer stopped, not kept]\n")
            return text
        self.turns.append({"role": "assistant", "content": text})
        self.out.write(f"\n[{format_stats(stats, seconds)}]\n")
        self.out.flush()
        note = stop_note(finish, params.max_tokens)
        if note:
            self.err.write(note + "\n")
        return text

    def stream(self, prompt: list[int], params: Any) -> tuple[str, str | None, dict | None, float]:
        """Write the answer as it commits; (text, finish_reason or None when Ctrl-C stopped it,
        stats, seconds). Closing the stream aborts an unfinished request."""
        started = time.perf_counter()
        text, finish, stats = "", None, None
        stream = self.llm.generate_stream([prompt], params)
        try:
            with deferred_interrupt() as interrupted:
                for delta in stream:
                    self.out.write(self.paint(delta["new_text"], delta["step_index"]))
                    self.out.flush()
                    text += delta["new_text"]
                    if delta["finished"]:
                        finish, stats = delta["finish_reason"], delta["stats"]
                    elif interrupted():
                        break
        finally:
            stream.close()
        return text, finish, stats, time.perf_counter() - started

    def paint(self, text: str, step: int) -> str:
        """`text` with the background colour of decode step `step` (when colouring)."""
        if not self.colour or not text:
            return text
        return f"\x1b[{COLOURS[step % len(COLOURS)]};97m{text}\x1b[0m"


def repl(session: ChatSession, read: Callable[[str], str]) -> int:
    """Read lines until /exit, end of input or Ctrl-C at the prompt; answer each one."""
    session.out.write(f"wedlm chat: {HELP}\n")
    if session.single_turn:
        session.out.write(SINGLE_TURN_NOTE + "\n")
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
    """Start the chat; 2 on a bad sampling option or model folder."""
    try:
        params = sampling_params_from_args(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    single_turn = prompt_defaults(args.model)["wedlm_single_turn"]
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    llm = load_llm(args, "chat")
    if llm is None:
        return 2
    session = ChatSession(llm, params, sys.stdout, system=args.system, colour=colour,
                          single_turn=single_turn, fit_context=args.max_tokens is None)
    return repl(session, input)
