"""Typed results that leave the engine: per-step stream deltas and per-request stats.

`StreamDelta` is the contract with the server (one per request that progressed
in a step); `RequestStats` carries the paper's metrics per request (section 3.1,
Eq. 4; docs/method.md, "Metrics") so that every result, not only a global counter, can be judged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log-probability (nats) and the most likely alternatives of its distribution.

    Attributes:
        token_id: the token.
        logprob: log p(token_id), float.
        top: up to k (token id, logprob) pairs, most likely first (k = the request's
            `logprobs` / `prompt_logprobs`; the token itself appears when it is among them).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def to_dict(self) -> dict:
        return {"token_id": self.token_id, "logprob": self.logprob, "top": [list(p) for p in self.top]}


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
        logprobs: with `SamplingParams.logprobs`, one `TokenLogprob` per new token, aligned
            with `new_token_ids`; else None.
        prompt_logprobs: with `SamplingParams.prompt_logprobs`, on the request's first delta:
            None for the first prompt token, then one `TokenLogprob` per prompt token.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    step_index: int
    stats: dict | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


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


def sum_stats(stats: Iterable[dict | None]) -> dict:
    """Totals of many requests' `RequestStats.to_dict()`s, ratios taken of the sums (Eq. 4).

    Averaging per-request ratios would weigh a 3-token answer like a 600-token one; the
    paper's tokens per forward and p_cache of a workload are ratios of sums.

    Args:
        stats: per-request stats dicts (None entries, e.g. a request that never started,
            count as nothing). A dict without `fed_tokens` contributes
            decode_tokens / p_cache when it has a p_cache.

    Returns:
        {"requests", "decode_tokens", "decode_forwards", "fed_tokens",
         "prefix_cache_hit_tokens", "tokens_per_forward" (0.0 without forwards),
         "p_cache" (1.0 when nothing was fed: no recomputation happened)}.
    """
    rows = [s for s in stats if s]
    n_gen = sum(int(s.get("decode_tokens") or 0) for s in rows)
    forwards = sum(int(s.get("decode_forwards") or 0) for s in rows)
    fed = sum(_fed_tokens(s) for s in rows)
    return {
        "requests": len(rows),
        "decode_tokens": n_gen,
        "decode_forwards": forwards,
        "fed_tokens": fed,
        "prefix_cache_hit_tokens": sum(int(s.get("prefix_cache_hit_tokens") or 0) for s in rows),
        "tokens_per_forward": n_gen / forwards if forwards else 0.0,
        "p_cache": n_gen / fed if fed else 1.0,
    }


def _fed_tokens(s: dict) -> float:
    """N_fwd of one request: `fed_tokens` when reported, else decode_tokens / p_cache."""
    if s.get("fed_tokens"):
        return float(s["fed_tokens"])
    if s.get("p_cache") and s.get("decode_tokens"):
        return int(s["decode_tokens"]) / float(s["p_cache"])
    return 0.0
