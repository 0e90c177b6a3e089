"""OpenAI response objects built from engine deltas: chunks, full responses, usage.

Pure functions over plain dicts. Completions use `object: "text_completion"` (streamed
chunks too, as OpenAI does); chat uses `chat.completion` / `chat.completion.chunk`, a
first chunk with `delta.role`, content chunks, and a final chunk with an empty delta and
the `finish_reason`. Streams end with `data: [DONE]`. `usage` carries OpenAI's token
counts plus WeDLM's `decode_forwards`, `tokens_per_forward` and `p_cache`
(docs/method.md, "Metrics"), aggregated over the choices.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..engine.outputs import sum_stats

DONE = "data: [DONE]\n\n"


@dataclass(slots=True)
class ChoiceState:
    """What has been committed so far for one choice."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: dict | None = None
    steps: int = 0
    logprobs: list = field(default_factory=list)  # engine `TokenLogprob`s of token_ids
    prompt_logprobs: list | None = None
    text_offset: int = 0  # legacy completions logprobs: offset of the next token in `text`

    def add(self, delta: Any, stop_ids: frozenset[int] = frozenset()) -> None:
        """Fold one engine delta in (`stop_ids`: see `text_logprobs`)."""
        self.text += delta.new_text or ""
        self.token_ids.extend(delta.new_token_ids or [])
        self.logprobs.extend(text_logprobs(delta, stop_ids))
        if getattr(delta, "prompt_logprobs", None) is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.new_token_ids:
            self.steps += 1
        if delta.finished:
            self.finish_reason = delta.finish_reason
            self.stats = delta.stats


def text_logprobs(delta: Any, stop_ids: frozenset[int]) -> list:
    """The delta's token logprobs without a final stop token, whose text the answer leaves out
    (finish_reason "stop" on a token in `stop_ids`, the request's stop ids)."""
    entries = list(getattr(delta, "logprobs", None) or [])
    ids = delta.new_token_ids or []
    if entries and delta.finished and delta.finish_reason == "stop" and ids and ids[-1] in stop_ids:
        entries.pop()
    return entries


@dataclass(slots=True)
class Envelope:
    """The fields every object of one response shares."""

    id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def base(self, chunk: bool) -> dict[str, Any]:
        """`{"id", "object", "created", "model"}` for a response or a chunk."""
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def stream_choice(env: Envelope, index: int, text: str | None = None, role: bool = False,
                  finish_reason: str | None = None, trace: dict | None = None,
                  logprobs: dict | None = None) -> dict[str, Any]:
    """One choice of a streamed chunk (chat `delta` or completion `text`), with the logprobs of its tokens."""
    if env.chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    if trace is not None:
        choice["wedlm"] = trace
    return choice


def chunk(env: Envelope, choices: list[dict[str, Any]], with_usage: bool,
          usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A streamed chunk; `usage` is null on every chunk but the last when usage is requested."""
    body = env.base(chunk=True)
    body["choices"] = choices
    if with_usage:
        body["usage"] = usage
    return body


def trace_of(delta: Any) -> dict[str, Any]:
    """The WeDLM decode trace of one delta: the step that committed these tokens."""
    return {"step": delta.step_index, "token_ids": list(delta.new_token_ids or []),
            "num_tokens": len(delta.new_token_ids or [])}


def usage(prompt_lengths: list[int], states: list[ChoiceState]) -> dict[str, Any]:
    """OpenAI usage plus WeDLM decode metrics over all choices.

    `tokens_per_forward` = completion tokens / decode forwards; `p_cache` = generated
    tokens / tokens fed through decode forwards (Eq. 4); the forwards, fed tokens and
    prefix-cache hits are the engine's `sum_stats` over the choices' stats.
    """
    completion = sum(len(s.token_ids) for s in states)
    totals = sum_stats(s.stats for s in states)
    forwards, fed = totals["decode_forwards"], totals["fed_tokens"]
    prompt = sum(prompt_lengths)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "decode_forwards": forwards,
        "tokens_per_forward": round(completion / forwards, 4) if forwards else 0.0,
        "p_cache": round(completion / fed, 4) if fed else (1.0 if completion else 0.0),
        "prefix_cache_hit_tokens": totals["prefix_cache_hit_tokens"],
    }


def full_response(env: Envelope, states: list[ChoiceState], usage_: dict[str, Any],
                  logprobs: list[dict | None] | None = None) -> dict[str, Any]:
    """The non-streamed response object; `logprobs`: each choice's logprobs object (None = null)."""
    body = env.base(chunk=False)
    logprobs = logprobs or [None] * len(states)
    if env.chat:
        body["choices"] = [
            {"index": i, "message": {"role": "assistant", "content": s.text}, "logprobs": lp,
             "finish_reason": s.finish_reason} for i, (s, lp) in enumerate(zip(states, logprobs))]
    else:
        body["choices"] = [
            {"index": i, "text": s.text, "logprobs": lp, "finish_reason": s.finish_reason}
            for i, (s, lp) in enumerate(zip(states, logprobs))]
    body["usage"] = usage_
    return body
