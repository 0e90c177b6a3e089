"""The decoding names and WeDLM defaults, in one place for the engine, server, CLI, bench and eval.

The defaults are the released WeDLM code's (window W = 16, entropy threshold
tau = 0.4, distance penalty lambda = 0.02; docs/method.md, "Streaming parallel
decoding"). A model folder may recommend its own in generation_config.json
(`wedlm_window_size`, `wedlm_entropy_threshold`, `wedlm_pos_penalty_factor`, and this engine's
`wedlm_stop_by_ar` and `wedlm_stop_in_run`, off unless the model asks for them);
`model_decoding_defaults` reads and checks them, and every caller that needs
"the model's tau" goes through it instead of restating a number. `check_knob` is
the one range check of each knob: `SamplingParams`, `LLM` (`EngineConfig`),
generation_config.json loading and the server's request schema all call it, so a
bad value gets the same message everywhere. The keys that say how
the model wants to be prompted (`wedlm_single_turn`, `wedlm_chat_only`, `max_new_tokens`)
are read and checked by `model_prompt_defaults` for the chat surfaces. No torch here:
the server's schemas and the CLI parsers import this module.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

from ..tokenizer import read_json
from .errors import RequestError

DECODERS = ("wedlm", "ar", "blockwise", "verified")
# the engine's `quantization` values besides None (float weights): `quantize.py`
QUANTIZATIONS = ("int8", "bf16")
# rows one forward may spend on `verified` windows before they shrink (`decoders/verified.py`,
# `window_for_load`; the engine's `verified_token_budget`). On one CPU core the shipped model's
# whole windows still paid at batch 8 (136 rows) and lost to `ar` at batch 32 (544 rows).
VERIFIED_TOKEN_BUDGET = 128
FALLBACKS = ("leftmost", "argmin")
DEFAULT_WINDOW = 16
DEFAULT_ENTROPY_THRESHOLD = 0.4
DEFAULT_POS_PENALTY = 0.02
DEFAULT_STOP_BY_AR = False  # Algorithm 1 as published: any mask may fill a stop token
DEFAULT_STOP_IN_RUN = False  # with stop_by_ar: no mask row may end the answer
GENERATION_DEFAULT_KEYS = ("wedlm_window_size", "wedlm_entropy_threshold", "wedlm_pos_penalty_factor",
                           "wedlm_stop_by_ar", "wedlm_stop_in_run")
DEFAULTS = dict(zip(GENERATION_DEFAULT_KEYS, (DEFAULT_WINDOW, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY,
                                              DEFAULT_STOP_BY_AR, DEFAULT_STOP_IN_RUN)))
# How the model folder wants to be prompted (the chat surfaces read these; the engine does not):
# wedlm_single_turn: trained on one user turn only, so a chat starts a fresh context every turn;
# wedlm_chat_only: trained on chat-formatted prompts only, so `wedlm generate` applies the template;
# max_new_tokens: the answer budget the command line uses when none is given.
PROMPT_DEFAULT_KEYS = ("wedlm_single_turn", "wedlm_chat_only", "max_new_tokens")


def generation_defaults(path: str | Path) -> dict:
    """The WeDLM keys present in the folder's generation_config.json (empty when absent; unchecked)."""
    raw = read_json(Path(path) / "generation_config.json")
    return {k: raw[k] for k in GENERATION_DEFAULT_KEYS if k in raw}


def _real(value) -> bool:
    """A real number: not a bool, not NaN."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# name -> (the limit as the error message states it, the test, the stored form)
_KNOBS = {
    "wedlm_window_size": ("an integer >= 1", lambda v: _integer(v) and v >= 1, int),
    # inf is allowed: every mask passes, so each step fills the whole window
    "wedlm_entropy_threshold": (">= 0 or None", lambda v: v is None or (_real(v) and v >= 0),
                                lambda v: None if v is None else float(v)),
    "wedlm_pos_penalty_factor": (">= 0 and finite", lambda v: _real(v) and 0 <= v < math.inf, float),
    "wedlm_stop_by_ar": ("true or false", lambda v: isinstance(v, bool), bool),
    "wedlm_stop_in_run": ("true or false", lambda v: isinstance(v, bool), bool),
}


def check_knob(name: str, value):
    """`value` of the WeDLM knob `name` (one of GENERATION_DEFAULT_KEYS), checked and normalised.

    Returns:
        int for `wedlm_window_size`, float or None for `wedlm_entropy_threshold`, float for
        `wedlm_pos_penalty_factor`, bool for `wedlm_stop_by_ar` and `wedlm_stop_in_run`.

    Raises:
        RequestError (a ValueError): `param` is `name`; the message is "NAME must be LIMIT, got VALUE".
    """
    limit, ok, store = _KNOBS[name]
    if not ok(value):
        raise RequestError(name, f"{name} must be {limit}, got {value!r}")
    return store(value)


def model_decoding_defaults(path: str | Path) -> dict:
    """W, tau, lambda, stop_by_ar and stop_in_run for a model folder: generation_config.json's values, else
    the defaults above.

    Returns:
        {"wedlm_window_size": int >= 1, "wedlm_entropy_threshold": float >= 0 or None,
         "wedlm_pos_penalty_factor": float >= 0, "wedlm_stop_by_ar": bool, "wedlm_stop_in_run": bool}.

    Raises:
        ValueError: a value in generation_config.json out of range, naming the file and key
            (a window of 0 would stall every request forever).
    """
    values = {**DEFAULTS, **generation_defaults(path)}
    try:
        return {name: check_knob(name, value) for name, value in values.items()}
    except RequestError as err:
        raise ValueError(f"{path}/generation_config.json: {err}") from None


def model_prompt_defaults(path: str | Path) -> dict:
    """How a model folder wants to be prompted: generation_config.json's `wedlm_single_turn`,
    `wedlm_chat_only` (both false when absent) and `max_new_tokens` (None when absent).

    Returns:
        {"wedlm_single_turn": bool, "wedlm_chat_only": bool, "max_new_tokens": int >= 1 or None}.

    Raises:
        ValueError: a value of the wrong type or range, naming the file and key.
    """
    raw = read_json(Path(path) / "generation_config.json")
    source = f"{path}/generation_config.json"
    out: dict = {}
    for key in ("wedlm_single_turn", "wedlm_chat_only"):
        value = raw.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"{source}: {key} must be true or false, got {value!r}")
        out[key] = value
    budget = raw.get("max_new_tokens")
    if budget is not None and (not isinstance(budget, numbers.Integral) or isinstance(budget, bool) or budget < 1):
        raise ValueError(f"{source}: max_new_tokens must be an integer >= 1, got {budget!r}")
    out["max_new_tokens"] = None if budget is None else int(budget)
    return out


__all__ = ["DECODERS", "DEFAULTS", "DEFAULT_ENTROPY_THRESHOLD", "DEFAULT_POS_PENALTY", "DEFAULT_STOP_BY_AR",
           "DEFAULT_STOP_IN_RUN", "DEFAULT_WINDOW", "FALLBACKS", "GENERATION_DEFAULT_KEYS", "PROMPT_DEFAULT_KEYS",
           "check_knob", "generation_defaults", "model_decoding_defaults", "model_prompt_defaults"]
