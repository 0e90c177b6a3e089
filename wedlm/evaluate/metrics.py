"""Speed metrics summed over many requests (docs/method.md, "Metrics"; paper Eq. 4).

What: `aggregate(stats, wall_s)` turns per-request engine stats into one row:
tokens per forward = sum N_gen / sum decode forwards; p_cache = sum N_gen / sum
N_fwd, where each request's N_fwd = N_gen / p_cache (the tokens it fed through
the network after prefill); tokens/s = sum N_gen / wall-clock seconds.

Why: averaging per-request ratios would weight a 3-token answer like a 600-token
one; ratios of sums are what Eq. 4 defines for a workload.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import mean

from ..engine.outputs import sum_stats


def aggregate(stats: Iterable[dict], wall_s: float) -> dict:
    """One metrics row from per-request stats dicts (engine `stats` layout).

    Args:
        stats: dicts with decode_tokens, decode_forwards, fed_tokens (or p_cache), ttft_s.
        wall_s: wall-clock seconds of the whole run (prefill included).
    Returns:
        {requests, decode_tokens, decode_forwards, tokens_per_forward, p_cache, wall_s,
         tokens_per_s, ttft_s (mean), ttft_max_s}; the sums and ratios are
         `wedlm.engine.outputs.sum_stats`'.
    """
    stats = list(stats)
    totals = sum_stats(stats)
    n_gen = totals["decode_tokens"]
    ttfts = [float(s["ttft_s"]) for s in stats if s.get("ttft_s") is not None]
    return {
        "requests": len(stats),
        "decode_tokens": n_gen,
        "decode_forwards": totals["decode_forwards"],
        "tokens_per_forward": totals["tokens_per_forward"],
        "p_cache": totals["p_cache"],
        "wall_s": wall_s,
        "tokens_per_s": n_gen / wall_s if wall_s > 0 else 0.0,
        "ttft_s": mean(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
    }
