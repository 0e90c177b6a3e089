"""Per-request sampling and decoding parameters (the public `wedlm.SamplingParams`).

Field names and defaults follow the official `wedlm` package so user code moves
over unchanged (temperature 0.2, top_p 1.0, top_k 0 = off, max_tokens 64,
entropy threshold 0.4, position penalty 0.02; wedlm-facts.md section 4). Two
WeDLM fields default to `MODEL_DEFAULT`: the engine replaces them with the
values in the model folder's generation_config.json when it has them, else
with the official defaults (`resolve`). Everything is validated here so that a
bad request fails at `add_request` with a ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

DECODERS = ("wedlm", "ar", "blockwise", "verified")
FALLBACKS = ("leftmost", "argmin")
OFFICIAL_ENTROPY_THRESHOLD = 0.4
OFFICIAL_POS_PENALTY = 0.02


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


@dataclass
class SamplingParams:
    """How one request is sampled and decoded.

    Attributes:
        temperature: 0 = greedy; > 0 scales logits before sampling.
        top_p: nucleus mass in (0, 1]; 1 = off.
        top_k: keep the k most likely tokens; 0 (or -1) = off.
        max_tokens: most tokens to generate (>= 1).
        stop: stop string(s), matched on the decoded text across token
            boundaries; the text ends before the match.
        stop_token_ids: extra stop ids on top of the model's (EOS, <|im_end|>).
        ignore_eos: do not stop on the model's stop ids (benchmarks).
        wedlm_entropy_threshold: tau of Algorithm 1 (paper section 5.2); masks
            whose distance-adjusted entropy is below it are filled each step.
            None = fill only the single lowest adjusted-entropy mask per step.
        wedlm_pos_penalty_factor: lambda of the distance penalty (Eq. 11).
        wedlm_fallback: which mask to fill when none passes tau: "leftmost"
            (this engine's default, never stalls the commit frontier) or
            "argmin" (the official rule: lowest adjusted entropy).
        decoding: "wedlm" (Streaming Parallel Decoding), "ar", "blockwise" or
            "verified" (lossless: drafts verified by the AR head).
        window_size: per-request window W; None = the engine's.
        seed: per-request RNG seed; the same seed gives the same output.

    Raises:
        ValueError: a field out of range; the message names the field and limit.
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
    decoding: str = "wedlm"
    window_size: int | None = None
    seed: int | None = None
    stop_strings: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and self.top_k >= -1,
               f"top_k must be an integer >= 0 (0 or -1 = off), got {self.top_k}")
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1,
               f"max_tokens must be an integer >= 1, got {self.max_tokens}")
        _check(self.decoding in DECODERS, f"decoding must be one of {DECODERS}, got {self.decoding!r}")
        _check(self.wedlm_fallback in FALLBACKS,
               f"wedlm_fallback must be one of {FALLBACKS}, got {self.wedlm_fallback!r}")
        _check(self.window_size is None or (isinstance(self.window_size, int) and self.window_size >= 1),
               f"window_size must be an integer >= 1, got {self.window_size}")
        tau = self.wedlm_entropy_threshold
        _check(tau is None or tau is MODEL_DEFAULT or tau >= 0,
               f"wedlm_entropy_threshold must be >= 0 or None, got {tau}")
        lam = self.wedlm_pos_penalty_factor
        _check(lam is MODEL_DEFAULT or lam >= 0, f"wedlm_pos_penalty_factor must be >= 0, got {lam}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        _check(all(isinstance(s, str) and s for s in stops), f"stop must be non-empty strings, got {self.stop!r}")
        self.stop_strings = stops
        ids = list(self.stop_token_ids or [])
        _check(all(isinstance(i, int) and i >= 0 for i in ids),
               f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        self.stop_token_ids = ids

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def resolve(self, model_defaults: dict | None = None) -> "SamplingParams":
        """A copy with every MODEL_DEFAULT replaced (model's generation_config first, then official)."""
        defaults = model_defaults or {}
        out = dataclasses.replace(self)
        if out.wedlm_entropy_threshold is MODEL_DEFAULT:
            out.wedlm_entropy_threshold = defaults.get("wedlm_entropy_threshold", OFFICIAL_ENTROPY_THRESHOLD)
        if out.wedlm_pos_penalty_factor is MODEL_DEFAULT:
            out.wedlm_pos_penalty_factor = defaults.get("wedlm_pos_penalty_factor", OFFICIAL_POS_PENALTY)
        return out


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
