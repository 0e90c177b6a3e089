"""The one range check of each logit control and logprob field (OpenAI / vLLM names and ranges).

`SamplingParams`, the server's request schema and the command line all call `check_control`,
so a bad value gets the same message everywhere. The controls themselves are applied to the
logits by `logits_processors.py`; logprobs are gathered by `logprobs.py`. No torch here: the
server's schemas and the CLI parsers import this module.
"""

from __future__ import annotations

import math
import numbers

from .errors import RequestError

MAX_LOGPROBS = 20  # OpenAI's limit for `top_logprobs` and legacy `logprobs`
LOGIT_BIAS_LIMIT = 100.0  # OpenAI: each bias in [-100, 100]
PENALTY_LIMIT = 2.0  # OpenAI: presence_penalty and frequency_penalty in [-2, 2]


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# name -> (the limit as the error message states it, the test, the stored form)
_CONTROLS = {
    "presence_penalty": ("a number in [-2, 2]", lambda v: _real(v) and abs(v) <= PENALTY_LIMIT, float),
    "frequency_penalty": ("a number in [-2, 2]", lambda v: _real(v) and abs(v) <= PENALTY_LIMIT, float),
    "repetition_penalty": ("a finite number > 0 (1 = off)", lambda v: _real(v) and v > 0, float),
    "min_p": ("a number in [0, 1]", lambda v: _real(v) and 0 <= v <= 1, float),
    "min_tokens": ("an integer >= 0", lambda v: _integer(v) and v >= 0, int),
    "logprobs": (f"an integer in [0, {MAX_LOGPROBS}] or None",
                 lambda v: v is None or (_integer(v) and 0 <= v <= MAX_LOGPROBS),
                 lambda v: None if v is None else int(v)),
    "top_logprobs": (f"an integer in [0, {MAX_LOGPROBS}] or None",
                     lambda v: v is None or (_integer(v) and 0 <= v <= MAX_LOGPROBS),
                     lambda v: None if v is None else int(v)),
    "prompt_logprobs": (f"an integer in [0, {MAX_LOGPROBS}] or None",
                        lambda v: v is None or (_integer(v) and 0 <= v <= MAX_LOGPROBS),
                        lambda v: None if v is None else int(v)),
}
CONTROL_NAMES = (*_CONTROLS, "logit_bias")


def check_control(name: str, value):
    """`value` of the control `name` (one of CONTROL_NAMES), checked and normalised.

    Returns:
        float for the penalties and min_p, int for min_tokens, int or None for logprobs,
        top_logprobs (the chat API's name of the same count) and prompt_logprobs, {int token id: float bias} for logit_bias (`check_logit_bias`).

    Raises:
        RequestError (a ValueError): `param` is `name`; the message is "NAME must be LIMIT, got VALUE".
    """
    if name == "logit_bias":
        return check_logit_bias(value)
    limit, ok, store = _CONTROLS[name]
    if not ok(value):
        raise RequestError(name, f"{name} must be {limit}, got {value!r}")
    return store(value)


def check_logit_bias(value) -> dict[int, float]:
    """OpenAI's `logit_bias`: token id -> bias added to its logit, each in [-100, 100].

    Keys may be integers or strings of integers (JSON object keys are strings); None or
    an empty mapping means no bias. Ids are checked against the vocabulary at intake.

    Raises:
        RequestError (param "logit_bias"): not a mapping, a key that is not a non-negative
            integer, a bias that is not a finite number in [-100, 100].
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("logit_bias", f"logit_bias must be an object mapping token ids to numbers in "
                                         f"[-100, 100], got {type(value).__name__}")
    out: dict[int, float] = {}
    for key, bias in value.items():
        token = _token_id(key)
        if token is None:
            raise RequestError("logit_bias", f"logit_bias keys must be token ids (non-negative integers), "
                                             f"got {key!r}")
        if not (_real(bias) and abs(bias) <= LOGIT_BIAS_LIMIT):
            raise RequestError("logit_bias", f"logit_bias values must be numbers in [-100, 100], "
                                             f"got {bias!r} for token {token}")
        out[token] = float(bias)
    return out


def _token_id(key) -> int | None:
    """A non-negative integer key, or a string of ASCII digits; None otherwise."""
    if _integer(key):
        return int(key) if key >= 0 else None
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12:
        return int(key)
    return None
