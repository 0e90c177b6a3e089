"""The decoding names and WeDLM defaults, in one place for the engine, server, CLI, bench and eval.

The defaults are the released WeDLM code's (window W = 16, entropy threshold
tau = 0.4, distance penalty lambda = 0.02; docs/method.md, "Streaming parallel
decoding"). A model folder may recommend its own in generation_config.json
(`wedlm_window_size`, `wedlm_entropy_threshold`, `wedlm_pos_penalty_factor`, and this engine's
`wedlm_stop_by_ar` and `wedlm_stop_in_run`, off unless the model asks for them);
`model_decoding_defaults` reads and checks them, and every caller that needs
"the model's tau" goes through it instead of restating a number. The keys that say how
the model wants to be prompted (`wedlm_single_turn`, `wedlm_chat_only`, `max_new_tokens`)
are read and checked by `model_prompt_defaults` for the chat surfaces. No torch here:
the server's schemas and the CLI parsers import this module.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

from ..tokenizer import read_json

DECODERS = ("wedlm", "ar", "blockwise", "verified")
FALLBACKS = ("leftmost", "argmin")
DEFAULT_WINDOW = 16
DEFAULT_ENTROPY_THRESHOLD = 0.4
DEFAULT_POS_PENALTY = 0.02
DEFAULT_STOP_BY_AR = False  # Algorithm 1 as published: any mask may fill a stop token
DEFAULT_STOP_IN_RUN = False  # with stop_by_ar: no mask row may end the answer
GENERATION_DEFAULT_KEYS = ("wedlm_window_size", "wedlm_entropy_threshold", "wedlm_pos_penalty_factor",
                           "wedlm_stop_by_ar", "wedlm_stop_in_run")
# How the model folder wants to be prompted (the chat surfaces read these; the engine does not):
# wedlm_single_turn: trained on one user turn only, so a chat starts a fresh context every turn;
# wedlm_chat_only: trained on chat-formatted prompts only, so `wedlm generate` applies the template;
# max_new_tokens: the answer budget the command line uses when none is given.
PROMPT_DEFAULT_KEYS = ("wedlm_single_turn", "wedlm_chat_only", "max_new_tokens")


def generation_defaults(path: str | Path) -> dict:
    """The WeDLM keys present in the folder's generation_config.json (empty when absent; unchecked)."""
    raw = read_json(Path(path) / "generation_config.json")
    return {k: raw[k] for k in GENERATION_DEFAULT_KEYS if k in raw}


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
    raw = generation_defaults(path)
    source = f"{path}/generation_config.json"
    window = raw.get("wedlm_window_size", DEFAULT_WINDOW)
    if not isinstance(window, numbers.Integral) or isinstance(window, bool) or window < 1:
        raise ValueError(f"{source}: wedlm_window_size must be an integer >= 1, got {window!r}")
    tau = raw.get("wedlm_entropy_threshold", DEFAULT_ENTROPY_THRESHOLD)
    if tau is not None and not _real_at_least_zero(tau, allow_inf=True):
        raise ValueError(f"{source}: wedlm_entropy_threshold must be >= 0 or None, got {tau!r}")
    lam = raw.get("wedlm_pos_penalty_factor", DEFAULT_POS_PENALTY)
    if not _real_at_least_zero(lam, allow_inf=False):
        raise ValueError(f"{source}: wedlm_pos_penalty_factor must be >= 0 and finite, got {lam!r}")
    stop_by_ar = raw.get("wedlm_stop_by_ar", DEFAULT_STOP_BY_AR)
    if not isinstance(stop_by_ar, bool):
        raise ValueError(f"{source}: wedlm_stop_by_ar must be true or false, got {stop_by_ar!r}")
    stop_in_run = raw.get("wedlm_stop_in_run", DEFAULT_STOP_IN_RUN)
    if not isinstance(stop_in_run, bool):
        raise ValueError(f"{source}: wedlm_stop_in_run must be true or false, got {stop_in_run!r}")
    return {"wedlm_window_size": int(window),
            "wedlm_entropy_threshold": None if tau is None else float(tau),
            "wedlm_pos_penalty_factor": float(lam), "wedlm_stop_by_ar": stop_by_ar,
            "wedlm_stop_in_run": stop_in_run}


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


def _real_at_least_zero(value, allow_inf: bool) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(value):
        return False
    return value >= 0 and (allow_inf or value < math.inf)


__all__ = ["DECODERS", "DEFAULT_ENTROPY_THRESHOLD", "DEFAULT_POS_PENALTY", "DEFAULT_STOP_BY_AR", "DEFAULT_STOP_IN_RUN", "DEFAULT_WINDOW", "FALLBACKS",
           "GENERATION_DEFAULT_KEYS", "PROMPT_DEFAULT_KEYS", "generation_defaults", "model_decoding_defaults",
           "model_prompt_defaults"]
