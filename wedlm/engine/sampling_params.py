"""Per-request sampling and decoding parameters (the public `wedlm.SamplingParams`).

Field names and defaults follow the official `wedlm` package so user code moves
over unchanged (temperature 0.2, top_p 1.0, top_k 0 = off, max_tokens 64; the
WeDLM defaults live in `defaults.py`, see docs/method.md). Four WeDLM fields
(`wedlm_entropy_threshold`, `wedlm_pos_penalty_factor`, `wedlm_stop_by_ar`,
`wedlm_stop_in_run`) default to `MODEL_DEFAULT`: the engine
replaces them with the values in the model folder's generation_config.json when
it has them, else with the defaults (`resolve`). Everything is validated here (the
WeDLM knobs by `defaults.check_knob`, their one check) so that a bad request fails
at `add_request` with a `RequestError` (a ValueError) whose `param` names the field.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from .controls import check_control
from .defaults import DECODERS, DEFAULTS, FALLBACKS, check_knob
from .errors import RequestError
from .structured import StructuredOutputs


class _ModelDefault:
    """Sentinel: "use the model's generation_config.json value, else the official default"."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MODEL_DEFAULT"


MODEL_DEFAULT = _ModelDefault()
# Sampling divides float32 logits by the temperature: a larger one overflows to inf.
FLOAT32_MAX = 3.4028234663852886e38


@dataclass
class SamplingParams:
    """How one request is sampled and decoded.

    Attributes:
        temperature: 0 = greedy; > 0 scales logits before sampling (at most float32's max).
        top_p: nucleus mass in [0, 1]; 1 = off; 0 keeps only the most likely
            token (the smallest nucleus), so the request decodes greedily.
        top_k: keep the k most likely tokens; 0 (or -1) = off.
        max_tokens: most tokens to generate (>= 1).
        stop: stop string(s), matched on the decoded text across token
            boundaries; the text ends before the match.
        stop_token_ids: extra stop ids on top of the model's (EOS, <|im_end|>).
        ignore_eos: do not stop on the model's stop ids (benchmarks).
        wedlm_entropy_threshold: tau of Algorithm 1 (paper section 5.2); masks
            whose distance-adjusted entropy is below it are filled each step.
            None = fill only the single lowest adjusted-entropy mask per step;
            inf = fill every mask.
        wedlm_pos_penalty_factor: lambda of the distance penalty (Eq. 11), >= 0 and finite
            (`wedlm` and `blockwise`; `verified` drafts by entropy alone).
        wedlm_fallback: which mask to fill when none passes tau: "leftmost"
            (this engine's default, never stalls the commit frontier) or
            "argmin" (the official rule: lowest adjusted entropy).
        wedlm_stop_by_ar: `wedlm` decoding only: fill the leftmost mask from the
            AR head's next-token logits (free in the same forward) every step,
            and let no other mask take a stop token, so only the AR head ends an
            answer (`decoders/streaming.py`). False = Algorithm 1 as published;
            default: the model's generation_config.json, else False.
        wedlm_stop_in_run: with `wedlm_stop_by_ar`, a mask row may also end the
            answer when every mask to its left is filled in the same forward
            (the stop closes a contiguous run up to the committed text), so an
            answer's last tokens and its stop can fill in one forward instead of
            the stop waiting one more (docs/method.md, "The ceiling"). No effect
            without `wedlm_stop_by_ar`; default: the model's
            generation_config.json, else False.
        decoding: "wedlm" (Streaming Parallel Decoding), "ar", "blockwise" or
            "verified" (lossless: drafts verified by the AR head); default:
            "wedlm" for a model with a [MASK] token, "ar" for a plain AR model.
        wedlm_window_size: per-request window W (>= 1); None = the engine's.
        seed: per-request RNG seed; the same seed gives the same output.
        logit_bias: {token id: bias in [-100, 100]} added to those logits (OpenAI).
        presence_penalty, frequency_penalty: in [-2, 2]; subtract presence_penalty
            from the logit of every token generated so far and frequency_penalty
            times its count (OpenAI).
        repetition_penalty: > 0, 1 = off; the logit of every token in the prompt or
            generated so far is divided by it when positive, multiplied when negative
            (transformers / vLLM).
        min_p: in [0, 1]; sampled requests drop tokens whose probability is below
            min_p times the most likely one's (0 = off; greedy requests unaffected).
        min_tokens: the stop ids cannot be chosen before this many tokens (>= 0,
            <= max_tokens); stop strings still apply. Under `structured`, a grammar that
            allows only a stop token ends the answer there, min_tokens or not.
        logprobs: None = off; k in [0, 20] returns each generated token's log-probability
            and the k most likely alternatives (`TokenLogprob`; which distribution:
            `logprobs.py`).
        prompt_logprobs: None = off; k in [0, 20] returns the log-probability of every
            prompt token after the first, from one teacher-forced forward, with k alternatives.

        structured: constrain the answer to a JSON schema, any JSON object, a regex or one of
            a list of strings: a `StructuredOutputs` or a dict of its fields (`{"regex": ...}`);
            every decoder then returns only answers the grammar accepts (`engine/structured.py`,
            docs/serving.md "Structured outputs"). Needs `pip install 'wedlm[structured]'`;
            not with `ignore_eos` (the grammar ends an answer with a stop token).

    The logit controls (logit_bias, the three penalties, min_tokens) act on every
    logits row a decoder samples or fills from, before entropy, argmax and sampling,
    in that order (`logits_processors.py`); tokens "generated so far" for a window slot
    are the committed output plus the window's filled slots to its left.

    Names: each WeDLM knob has one name, the official `wedlm` package's, used by
    this class, `LLM(wedlm_window_size=...)`, generation_config.json and the
    server's request fields. The CLI flags are those names in dashes
    (`--wedlm-window-size`, `--wedlm-entropy-threshold`, `--wedlm-pos-penalty-factor`,
    `--wedlm-stop-by-ar`, `--wedlm-stop-in-run`), with the short aliases
    `--window-size`, `--threshold`, `--penalty`, `--stop-by-ar` and `--stop-in-run`.
    The decoder code and docs/method.md write W, tau and lambda where they follow
    the paper's equations. `defaults.check_knob` is the one range check of each knob.

    Raises:
        RequestError (a ValueError): a field out of range; `param` is the field, the
            message names it and its limit.
    """

    temperature: float = 0.2
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    wedlm_entropy_threshold: float | None | _ModelDefault = MODEL_DEFAULT
    wedlm_pos_penalty_factor: float | _ModelDefault = MODEL_DEFAULT
    wedlm_fallback: str = "leftmost"
    wedlm_stop_by_ar: bool | _ModelDefault = MODEL_DEFAULT
    wedlm_stop_in_run: bool | _ModelDefault = MODEL_DEFAULT
    decoding: str | _ModelDefault = MODEL_DEFAULT
    wedlm_window_size: int | None = None
    seed: int | None = None
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: StructuredOutputs | dict | None = None
    stop_strings: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        self.temperature = _real("temperature", self.temperature, ">= 0 and at most float32's max 3.4028235e38",
                                 lambda v: 0 <= v <= FLOAT32_MAX)
        self.top_p = _real("top_p", self.top_p, "in [0, 1]", lambda v: 0 <= v <= 1)
        self.top_k = _integer("top_k", self.top_k, ">= 0 (0 or -1 = off)", lambda v: v >= -1)
        self.max_tokens = _integer("max_tokens", self.max_tokens, ">= 1", lambda v: v >= 1)
        _check(self.decoding is MODEL_DEFAULT or (isinstance(self.decoding, str) and self.decoding in DECODERS),
               "decoding",
               f"decoding must be one of {DECODERS}, got {self.decoding!r}")
        _check(isinstance(self.wedlm_fallback, str) and self.wedlm_fallback in FALLBACKS, "wedlm_fallback",
               f"wedlm_fallback must be one of {FALLBACKS}, got {self.wedlm_fallback!r}")
        for name in DEFAULTS:  # the WeDLM knobs; None = the engine's window
            value = getattr(self, name)
            if value is not MODEL_DEFAULT and not (name == "wedlm_window_size" and value is None):
                setattr(self, name, check_knob(name, value))
        if self.seed is not None:
            self.seed = _integer("seed", self.seed, "", lambda v: True)
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if isinstance(self.stop, str):
            stops = [self.stop]
        else:
            _check(self.stop is None or isinstance(self.stop, (list, tuple)), "stop",
                   f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
            stops = list(self.stop or [])
        _check(all(isinstance(s, str) and s for s in stops), "stop",
               f"stop must be non-empty strings, got {self.stop!r}")
        self.stop_strings = stops
        _check(self.stop_token_ids is None or isinstance(self.stop_token_ids, (list, tuple)), "stop_token_ids",
               f"stop_token_ids must be a list of non-negative integers, got {self.stop_token_ids!r}")
        ids = list(self.stop_token_ids or [])
        _check(all(_is_int(i) and i >= 0 for i in ids), "stop_token_ids",
               f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        self.stop_token_ids = [int(i) for i in ids]
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
                     "logprobs", "prompt_logprobs"):
            setattr(self, name, check_control(name, getattr(self, name)))
        self.logit_bias = check_control("logit_bias", self.logit_bias) or None
        _check(self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        if self.structured is not None:
            self.structured = _structured(self.structured)
            _check(not self.ignore_eos, "structured", "structured cannot be combined with ignore_eos: "
                                                      "a constrained answer ends with a stop token")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or top_p 0 (a nucleus of the single most likely token)."""
        return self.temperature == 0 or self.top_p == 0

    @property
    def has_logit_controls(self) -> bool:
        """Any of logit_bias, the penalties or min_tokens is set (the logits need processing)."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.min_tokens)

    def resolve(self, model_defaults: dict | None = None) -> SamplingParams:
        """A copy with every MODEL_DEFAULT replaced (model's generation_config first, then `defaults.py`)."""
        defaults = {**DEFAULTS, **(model_defaults or {})}
        changes = {name: defaults[name] for name in DEFAULTS if getattr(self, name) is MODEL_DEFAULT}
        if self.decoding is MODEL_DEFAULT:  # a plain AR model (no [MASK]) decodes with "ar"
            changes["decoding"] = defaults.get("decoding", "wedlm")
        return dataclasses.replace(self, **changes)  # validates the model's values too


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise RequestError(param, message)


def _structured(value) -> StructuredOutputs:
    """`structured` as a `StructuredOutputs` (built, and so checked, from a dict)."""
    if isinstance(value, StructuredOutputs):
        return value
    _check(isinstance(value, dict), "structured",
           f"structured must be a StructuredOutputs or a dict, got {type(value).__name__}")
    try:
        return StructuredOutputs(**value)
    except TypeError:
        raise RequestError("structured", f"structured takes the keys json_schema, json_object, regex, choice; "
                                         f"got {sorted(value)}") from None


def _is_int(value) -> bool:
    """An integer (numpy ones included), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(name: str, value, limit: str, ok) -> float:
    """`value` as a float if it is a real number (not a bool, not NaN) satisfying `ok`."""
    good = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    _check(good and ok(float(value)), name, f"{name} must be {limit}, got {value!r}")
    return float(value)


def _integer(name: str, value, limit: str, ok) -> int:
    """`value` as an int if it is an integer (not a bool) satisfying `ok`."""
    _check(_is_int(value) and ok(int(value)), name,
           f"{name} must be an integer{' ' if limit else ''}{limit}, got {value!r}")
    return int(value)
