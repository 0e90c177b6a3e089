"""Speed metrics summed over many requests (docs/method.md, "Metrics"; paper Eq. 4).

What: `aggregate(stats, wall_s)` turns per-request engine stats into one row:
tokens per forward = sum N_gen / sum decode forwards; p_cache = sum N_gen / sum
N_fwd, where each request's N_fwd = N_gen / p_cache (the tokens it fed through
the network after prefill); tokens/s = sum N_gen / wall-clock seconds.

Why: averaging per-request ratios would weight a 3-token answer like a 600-token
one; ratios of sums are what Eq. 4 defines for a workload.
"""

from __future__ import annotations

from statistics import mean
from typing import Iterable


def aggregate(stats: Iterable[dict], wall_s: float) -> dict:
    """One metrics row from per-request stats dicts (engine `stats` layout).

    Args:
        stats: dicts with decode_tokens, decode_forwards, fed_tokens (or p_cache), ttft_s.
        wall_s: wall-clock seconds of the whole run (prefill included).
    Returns:
        {requests, decode_tokens, decode_forwards, tokens_per_forward, p_cache, wall_s,
         tokens_per_s, ttft_s (mean), ttft_max_s}.
    """
    stats = list(stats)
    n_gen = sum(int(s.get("decode_tokens", 0)) for s in stats)
    forwards = sum(int(s.get("decode_forwards", 0)) for s in stats)
    fed = sum(_fed_tokens(s) for s in stats)
    ttfts = [float(s["ttft_s"]) for s in stats if s.get("ttft_s") is not None]
    return {
        "requests": len(stats),
        "decode_tokens": n_gen,
        "decode_forwards": forwards,
        "tokens_per_forward": n_gen / forwards if forwards else 0.0,
        "p_cache": n_gen / fed if fed else 1.0,
        "wall_s": wall_s,
        "tokens_per_s": n_gen / wall_s if wall_s > 0 else 0.0,
        "ttft_s": mean(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
    }


def _fed_tokens(s: dict) -> float:
    """N_fwd of one request: `fed_tokens` when reported, else N_gen / p_cache."""
    if s.get("fed_tokens"):
        return float(s["fed_tokens"])
    if s.get("p_cache") and s.get("decode_tokens"):
        return int(s["decode_tokens"]) / float(s["p_cache"])
    return 0.0
