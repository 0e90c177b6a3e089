"""What one request may contain and how much work the server holds: the checks that
run before a prompt is tokenized, so no body can crash the server or stall other clients.

- `parse_json_body`: bytes -> a JSON object whose every value is safe to validate and
  render: no lone surrogates (the tokenizer and the UTF-8 encoder reject them), no
  NaN/Infinity and no number beyond float32's range (the engine samples in float32), no
  nesting deeper than `MAX_JSON_DEPTH`. A refusal is a 400 naming the value's dotted
  path (`messages.0.content`), like pydantic's errors.
- `ServeLimits`: the server's knobs, `max_seqs_per_request` (prompts x `n` of one
  request) and `max_queued_seqs` (engine sequences the server holds at once, waiting or
  running); checked here, once, for the CLI and the library.
- `PromptBound`: a prompt that cannot fit the context is refused from its character
  count, before tokenizing. One token covers at most `chars_per_token` characters (the
  vocabulary's longest entry, x4 for normalizers such as NFC that compose up to three
  characters into one), so a prompt longer than `max_model_len x chars_per_token`
  characters has more than `max_model_len` tokens.
- `Admission`: the count of held sequences; a request that would exceed
  `max_queued_seqs` is a 429 with `Retry-After`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .errors import APIError, bad_request

FLOAT32_MAX = 3.4028234663852886e38
MAX_JSON_DEPTH = 32
NORMALIZER_SLACK = 4  # NFC/NFKC compose at most three characters into one
# vLLM's long-standing default `max_num_seqs`: one request may ask for as many sequences as
# its engine batches at once by default, and no more.
DEFAULT_MAX_SEQS_PER_REQUEST = 256
DEFAULT_MAX_QUEUED_SEQS = 1024
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ServeLimits:
    """Per-request and server-wide work limits of `wedlm serve`.

    Args:
        max_seqs_per_request: most engine sequences (prompts x `n`) one request may start.
        max_queued_seqs: most engine sequences the server holds at once (waiting or running);
            a request beyond it gets 429 with `Retry-After`.

    Raises:
        ValueError: a limit that is not an integer >= 1, naming it.
    """

    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST
    max_queued_seqs: int = DEFAULT_MAX_QUEUED_SEQS

    def __post_init__(self) -> None:
        for name in ("max_seqs_per_request", "max_queued_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


# ----- the JSON body -----
def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object whose values `check_json_values` accepts.

    Raises:
        APIError: 400, param "body" for bytes that are not UTF-8 JSON or not an object
            (nesting deep enough to exhaust the parser included), else the value's path.
    """
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as err:
        raise bad_request("body", f"Invalid JSON in the request body: {err}") from err
    except RecursionError as err:
        raise bad_request("body", f"Invalid JSON in the request body: nested deeper than {MAX_JSON_DEPTH} "
                                  "levels") from err
    if not isinstance(body, dict):
        raise bad_request("body", "The request body must be a JSON object")
    check_json_values(body)
    return body


def check_json_values(body: dict[str, Any]) -> None:
    """Refuse a value no field may hold, wherever it is (unknown fields and keys included).

    Raises:
        APIError: 400 naming the dotted path of the first bad value: a string (or key)
            with a lone surrogate, a non-finite number or one beyond float32's range,
            nesting deeper than `MAX_JSON_DEPTH`.
    """
    stack: list[tuple[Any, tuple[str, ...]]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            _refuse(path, f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, float):
            _check_float(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, (*path, key))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value))


def _check_text(text: str, path: tuple[str, ...]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        _refuse(path, f"contains a lone surrogate (U+{ord(text[err.start]):04X} at character {err.start}); "
                      "strings must be valid Unicode")


def _check_float(number: float, path: tuple[str, ...]) -> None:
    if not math.isfinite(number):
        _refuse(path, f"must be a finite number, got {number}")
    if abs(number) > FLOAT32_MAX:
        _refuse(path, f"must be within float32's range (|x| <= 3.4028235e38), got {number:g}")


def _refuse(path: tuple[str, ...], problem: str) -> None:
    param = ".".join(path) or "body"
    raise bad_request(param, f"Invalid value for '{param}': {problem}")


# ----- prompt size, before tokenizing -----
class PromptBound:
    """The cheap upper bound on a prompt's length in characters (see the module docstring).

    Args:
        tokenizer: HF tokenizer (its `get_vocab()`); without one there is no bound.
        max_model_len: the engine's context length in tokens.
    """

    def __init__(self, tokenizer: Any, max_model_len: int):
        self.max_model_len = int(max_model_len)
        self.chars_per_token = longest_token(tokenizer) * NORMALIZER_SLACK
        self.max_chars = self.max_model_len * self.chars_per_token if self.chars_per_token else None

    def check_text(self, param: str, chars: int, what: str) -> None:
        """400 naming `param` when `chars` characters cannot fit the context.

        Raises:
            APIError: 400 with the count and the limit.
        """
        if self.max_chars is not None and chars > self.max_chars:
            raise bad_request(param, f"Invalid value for '{param}': {what} has {chars} characters; at most "
                                     f"{self.max_chars} can fit max_model_len {self.max_model_len} (one token "
                                     f"covers at most {self.chars_per_token} characters)")

    def check_count(self, param: str, count: int, what: str) -> None:
        """400 naming `param` when `count` items of at least one token each cannot fit.

        Raises:
            APIError: 400 with the count and the limit.
        """
        if count >= self.max_model_len:
            raise bad_request(param, f"Invalid value for '{param}': {count} {what}; max_model_len "
                                     f"{self.max_model_len} fits at most {self.max_model_len - 1}")


def longest_token(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry (added tokens included); 0 without one.

    For byte-level BPE an entry has one character per byte, for SentencePiece one per
    character, so no token consumes more input characters than its entry has.
    """
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # no vocabulary to read: no bound
        return 0
    return max((len(token) for token in vocab), default=0)


# ----- queued work -----
class Admission:
    """How many engine sequences the server holds; used from the event loop thread only.

    Args:
        limits: `max_seqs_per_request` and `max_queued_seqs`.
    """

    def __init__(self, limits: ServeLimits):
        self.limits = limits
        self.held = 0

    def check_request(self, prompts: int, n: int) -> None:
        """400 when one request asks for more sequences than `max_seqs_per_request`, or than
        `max_queued_seqs` (which no retry could admit: a 429 would never clear).

        Raises:
            APIError: 400, param "prompt" for a batch of prompts, else "n".
        """
        seqs = prompts * n
        cap, name = min((self.limits.max_seqs_per_request, "max_seqs_per_request"),
                        (self.limits.max_queued_seqs, "max_queued_seqs"))
        if seqs > cap:
            param = "prompt" if prompts > 1 else "n"
            raise bad_request(param, f"Invalid value for '{param}': {prompts} prompt(s) x n={n} is {seqs} "
                                     f"sequences; at most {cap} per request ({name})")

    def reserve(self, seqs: int) -> Ticket:
        """Hold `seqs` sequences until the ticket is released.

        Raises:
            APIError: 429 with `Retry-After` when the server would hold more than
                `max_queued_seqs`.
        """
        cap = self.limits.max_queued_seqs
        if self.held + seqs > cap:
            raise APIError(f"The server holds {self.held} sequences and at most {cap} (max_queued_seqs); "
                           f"retry in {RETRY_AFTER_S} s", status=429, type="rate_limit_error",
                           code="server_busy", headers={"Retry-After": str(RETRY_AFTER_S)})
        self.held += seqs
        return Ticket(self, seqs)


class Ticket:
    """Sequences held by one request; `release()` is idempotent."""

    def __init__(self, admission: Admission, seqs: int):
        self.admission = admission
        self.seqs = seqs

    def release(self) -> None:
        """Give the sequences back (again: no-op)."""
        self.admission.held -= self.seqs
        self.seqs = 0
