"""OpenAI logprob objects from the engine's `TokenLogprob`s: chat's `content` list and the legacy
completions shape.

Chat (`logprobs: true`, `top_logprobs: k`): `{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}`. Completions
(`logprobs: k`): `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
"text_offset"}`, with `echo` the prompt's entries first (the first prompt token has null
logprob and null alternatives). `text_offset` is each token's character offset in the
choice's returned `text`, counted over the tokens' own strings.

A token's string is its UTF-8 bytes decoded with replacement (a token holding part of a
multi-byte character shows U+FFFD; `bytes` has the exact bytes). Bytes come from the
byte-level BPE piece when the tokenizer is byte-level, else from the decoded token.
Which distribution the values are of: `wedlm.engine.logprobs`.
"""

from __future__ import annotations

from typing import Any

from ..engine.outputs import TokenLogprob
from .protocol import text_logprobs

# JSON has no -inf. A token the model cannot emit (the [MASK] symbol, banned from every output
# row, in an echoed prompt; a token outside a top-k) has logprob -inf in the engine and reads this
# value in a response, the floor vLLM's OpenAI server also uses.
LOGPROB_FLOOR = -9999.0


def json_logprob(logprob: float) -> float:
    """`logprob` as a response carries it: at least `LOGPROB_FLOOR`."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


class TokenStrings:
    """The string and bytes of token ids under one tokenizer (cached; pure lookups after the first use).

    Args:
        tokenizer: an HF tokenizer, or None (tokens then read "<id>").
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._bytes_of: dict[str, int] | None = None

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(string, UTF-8 bytes) of one token."""
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._raw_bytes(token_id)
            hit = self._cache[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit

    def _raw_bytes(self, token_id: int) -> bytes:
        if self.tokenizer is None:
            return f"<{token_id}>".encode()
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return f"<{token_id}>".encode()
        if self._bytes_of is None:
            self._bytes_of = _byte_decoder()
        if all(ch in self._bytes_of for ch in piece):
            return bytes(self._bytes_of[ch] for ch in piece)
        return self.tokenizer.decode([int(token_id)]).encode("utf-8")


def chat_entries(entries: list[TokenLogprob], strings: TokenStrings) -> list[dict[str, Any]]:
    """OpenAI chat `logprobs.content` items for these tokens."""
    out = []
    for e in entries:
        token, raw = strings(e.token_id)
        top = []
        for t, lp in e.top:
            s, b = strings(t)
            top.append({"token": s, "logprob": json_logprob(lp), "bytes": b})
        out.append({"token": token, "logprob": json_logprob(e.logprob), "bytes": raw, "top_logprobs": top})
    return out


def chat_logprobs(entries: list[TokenLogprob], strings: TokenStrings) -> dict[str, Any]:
    """The chat choice's `logprobs` object."""
    return {"content": chat_entries(entries, strings), "refusal": None}


def completion_logprobs(entries: list[TokenLogprob | None], token_ids: list[int], strings: TokenStrings,
                        offset: int = 0) -> tuple[dict[str, Any], int]:
    """The legacy completions `logprobs` object of these tokens and the offset after them.

    Args:
        entries: one per token; None for a token without a logprob (the first prompt token).
        token_ids: the tokens (for the None entries' strings).
        offset: the text offset of the first token in the choice's text.
    """
    body: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, e in zip(token_ids, entries):
        token = strings(token_id)[0]
        body["tokens"].append(token)
        body["token_logprobs"].append(None if e is None else json_logprob(e.logprob))
        body["top_logprobs"].append(None if e is None else {strings(t)[0]: json_logprob(lp) for t, lp in e.top})
        body["text_offset"].append(offset)
        offset += len(token)
    return body, offset


def merge_completion(first: dict[str, Any] | None, second: dict[str, Any]) -> dict[str, Any]:
    """Two legacy logprob objects of consecutive tokens as one."""
    if first is None:
        return second
    return {key: first[key] + second[key] for key in second}


def stop_ids(llm: Any, req: Any) -> frozenset[int]:
    """The ids that end this request: its `stop_token_ids`, plus the model's unless `ignore_eos`."""
    model = frozenset() if req.ignore_eos else frozenset(getattr(getattr(llm, "engine", None), "stop_ids", ()))
    return model | frozenset(req.stop_token_ids or ())


def distribution(llm: Any, req: Any) -> str:
    """Which distribution the generated tokens' logprobs are of: "ar_head" (`ar`, `verified`) or
    "mask_slot" (`wedlm`, `blockwise`), for the request's decoder (else the model's default)."""
    decoding = req.decoding or getattr(getattr(llm, "engine", None), "model_defaults", {}).get("decoding", "wedlm")
    return "ar_head" if decoding in ("ar", "verified") else "mask_slot"


def wanted(req: Any) -> bool:
    """Whether the request asked for logprobs (chat: `logprobs: true`; completions: `logprobs: k`),
    as its endpoint reads them (`logprob_kwargs`), whatever unknown fields the body holds."""
    return bool(req.logprob_kwargs())


def choice_logprobs(chat: bool, state: Any, strings: TokenStrings, prompt_ids: list[int] | None) -> dict[str, Any]:
    """A whole choice's logprobs object (`protocol.ChoiceState`); `prompt_ids` for `echo` (completions)."""
    if chat:
        return chat_logprobs(state.logprobs, strings)
    entries, ids = list(state.logprobs), list(state.token_ids)
    if prompt_ids is not None and state.prompt_logprobs is not None:
        entries, ids = list(state.prompt_logprobs) + entries, list(prompt_ids) + ids
    return completion_logprobs(entries, ids, strings)[0]


def delta_logprobs(chat: bool, state: Any, delta: Any, strings: TokenStrings,
                   stop_ids: frozenset[int]) -> dict[str, Any] | None:
    """The logprobs object of one streamed delta's tokens (advances the choice's text offset;
    a final stop token is left out as in `protocol.text_logprobs`)."""
    entries = text_logprobs(delta, stop_ids)
    if not entries:
        return None
    if chat:
        return chat_logprobs(entries, strings)
    body, state.text_offset = completion_logprobs(entries, delta.new_token_ids, strings, state.text_offset)
    return body


def echo_logprobs(state: Any, prompt_ids: list[int], strings: TokenStrings) -> dict[str, Any]:
    """The streamed echo chunk's logprobs: the prompt's (advances the choice's text offset)."""
    entries = state.prompt_logprobs or [None] * len(prompt_ids)
    body, state.text_offset = completion_logprobs(entries, prompt_ids, strings, state.text_offset)
    return body
