"""Typed results that leave the engine: per-step stream deltas and per-request stats.

`StreamDelta` is the contract with the server (one per request that progressed
in a step); `RequestStats` carries the paper's metrics per request (section 3.1,
Eq. 4; docs/method.md, "Metrics") so that every result, not only a global counter, can be judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StreamDelta:
    """What one engine step produced for one request.

    Attributes:
        request_id: the id returned by `add_request`.
        new_token_ids: tokens committed this step (after stop handling).
        new_text: text that became final this step (never a broken UTF-8
            character, never any part of a stop string).
        finished: the request is done; no more deltas follow.
        finish_reason: "stop" | "length" | "abort" | None (a failed request finishes
            "abort" with `error` set).
        step_index: the request's decode step number (0 = first forward).
        stats: `RequestStats.to_dict()` when finished, else None.
        error: message when the request failed, else None.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    step_index: int
    stats: dict | None = None
    error: str | None = None


@dataclass
class RequestStats:
    """Per-request metrics.

    Attributes:
        prompt_tokens: prompt length.
        decode_tokens: tokens generated (N_gen).
        decode_forwards: forwards whose logits this request read (the first one
            shares its forward with the prefill).
        fed_tokens: token instances fed for generation in those forwards
            (window slots, drafts, the AR anchor, recomputed outputs): N_fwd of Eq. 4.
        prefix_cache_hit_tokens: tokens whose KV came from the prefix cache
            (re-admissions after a preemption included).
        ttft_s: seconds from arrival to the first committed token.
        decode_time_s: seconds from the end of the first forward to the finish.
        commits: tokens committed at each decode forward (the decode trace).
        preemptions: times the request lost its KV blocks and was recomputed.
    """

    prompt_tokens: int = 0
    decode_tokens: int = 0
    decode_forwards: int = 0
    fed_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    ttft_s: float | None = None
    decode_time_s: float = 0.0
    commits: list[int] = field(default_factory=list)
    preemptions: int = 0

    @property
    def tokens_per_forward(self) -> float:
        return self.decode_tokens / self.decode_forwards if self.decode_forwards else 0.0

    @property
    def p_cache(self) -> float:
        """Eq. 4: generated tokens / token instances fed in decode forwards (1 for AR)."""
        return self.decode_tokens / self.fed_tokens if self.fed_tokens else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens committed after the first forward per second of `decode_time_s`."""
        later = self.decode_tokens - (self.commits[0] if self.commits else 0)
        return later / self.decode_time_s if self.decode_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tokens_per_forward"] = self.tokens_per_forward
        out["p_cache"] = self.p_cache
        out["decode_tokens_per_s"] = self.decode_tokens_per_s
        return out
