"""Prometheus metrics of the server (`GET /metrics`), on a registry of its own.

Per-request numbers (tokens, decode forwards, tokens per forward, p_cache of
docs/method.md, "Metrics"; time to first token) are recorded when a request finishes;
engine gauges (queue length, running requests, KV blocks in use, prefix-cache hits) are
read at scrape time from the engine loop's latest `LLM.metrics()` snapshot, so scraping
never touches the engine from another thread. One registry per app keeps several
servers in one process (tests) apart.

Inference gateways (the Gateway API Inference Extension's model-server protocol, llm-d)
route on waiting requests, running requests and KV-cache utilisation, scraped under vLLM's
names; `GATEWAY_ALIASES` exports the same engine values under those names too, so such a
gateway or a vLLM dashboard reads a wedlm server unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TPF_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0)
P_CACHE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# name in LLM.metrics() -> (Prometheus name, kind, help)
ENGINE_FIELDS = {
    "num_waiting": ("wedlm_queue_length", "gauge", "Requests waiting for admission."),
    "num_running": ("wedlm_running_requests", "gauge", "Requests in the running batch."),
    "kv_blocks_used": ("wedlm_kv_blocks_in_use", "gauge", "Paged KV-cache blocks in use."),
    "kv_blocks_total": ("wedlm_kv_blocks_total", "gauge", "Paged KV-cache blocks in all."),
    "kv_blocks_free": ("wedlm_kv_blocks_free", "gauge", "Free paged KV-cache blocks."),
    "prefix_cache_hit_tokens": ("wedlm_prefix_cache_hit_tokens", "counter",
                                "Prompt tokens served from the prefix cache."),
    "prefix_cache_queries": ("wedlm_prefix_cache_queries", "counter",
                             "Prompt tokens looked up in the prefix cache."),
}

# vLLM's name -> (wedlm name it repeats, kind); the derived ratios are computed in `derived`
GATEWAY_ALIASES = {
    "vllm:num_requests_waiting": ("wedlm_queue_length", "gauge"),
    "vllm:num_requests_running": ("wedlm_running_requests", "gauge"),
    "vllm:kv_cache_usage_perc": ("wedlm_kv_cache_usage", "gauge"),
    "vllm:prefix_cache_hits": ("wedlm_prefix_cache_hit_tokens", "counter"),
    "vllm:prefix_cache_queries": ("wedlm_prefix_cache_queries", "counter"),
}
DERIVED_HELP = {
    "wedlm_kv_cache_usage": "KV-cache utilisation: blocks in use / blocks in all, 0..1.",
    "wedlm_prefix_cache_hit_rate": "Prompt tokens served from the prefix cache / prompt tokens looked up, "
                                   "since start, 0..1 (0 before any lookup).",
}


def derived(values: dict[str, Any]) -> dict[str, float]:
    """The ratios gateways route on, from an engine snapshot: KV-cache use and prefix-cache
    hit rate, each in [0, 1] (0 when the denominator is 0 or absent)."""
    out = {}
    total, used = values.get("kv_blocks_total"), values.get("kv_blocks_used")
    if total is not None and used is not None:
        out["wedlm_kv_cache_usage"] = float(used) / float(total) if total else 0.0
    queries, hits = values.get("prefix_cache_queries"), values.get("prefix_cache_hit_tokens")
    if queries is not None and hits is not None:
        out["wedlm_prefix_cache_hit_rate"] = float(hits) / float(queries) if queries else 0.0
    return out


class EngineCollector:
    """Exports the engine snapshot (a dict from `LLM.metrics()`) at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def collect(self):
        """Yield one metric family per known engine field present in the snapshot, the
        derived ratios, then the vLLM-named aliases of the gateway metrics."""
        values = self.snapshot() or {}
        exported: dict[str, tuple[float, str]] = {}
        for key, (name, kind, help_text) in ENGINE_FIELDS.items():
            if key in values:
                exported[name] = (float(values[key]), help_text)
                yield family(name, kind, help_text, float(values[key]))
        for name, value in derived(values).items():
            exported[name] = (value, DERIVED_HELP[name])
            yield family(name, "gauge", DERIVED_HELP[name], value)
        for alias, (name, kind) in GATEWAY_ALIASES.items():
            if name in exported:
                value, help_text = exported[name]
                yield family(alias, kind, f"{help_text} (alias of {name}, vLLM's name)", value)


def family(name: str, kind: str, help_text: str, value: float):
    """One gauge or counter sample (a counter's name gains `_total` in the exposition)."""
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    return cls(name, help_text, value=value)


class ServerMetrics:
    """All metrics of one server; thread-safe (prometheus_client's own locks)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter("wedlm_requests", "HTTP API requests by endpoint and status code.",
                                ["endpoint", "status"], registry=reg)
        self.finished = Counter("wedlm_requests_finished", "Engine requests finished, by reason (error: failed).",
                                ["finish_reason"], registry=reg)
        self.prompt_tokens = Counter("wedlm_prompt_tokens", "Prompt tokens of finished requests.",
                                     registry=reg)
        self.generation_tokens = Counter("wedlm_generation_tokens", "Generated (committed) tokens.",
                                         registry=reg)
        self.decode_forwards = Counter("wedlm_decode_forwards", "Decode forwards after prefill.",
                                       registry=reg)
        self.prefix_hit_requests = Counter("wedlm_prefix_cache_hit_requests",
                                           "Requests whose prompt hit the prefix cache.", registry=reg)
        self.tokens_per_forward = Histogram("wedlm_tokens_per_forward",
                                            "Generated tokens per decode forward, per request.",
                                            buckets=TPF_BUCKETS, registry=reg)
        self.p_cache = Histogram("wedlm_p_cache", "Prefix cacheability p_cache (Eq. 4), per request.",
                                 buckets=P_CACHE_BUCKETS, registry=reg)
        self.ttft = Histogram("wedlm_time_to_first_token_seconds", "Time to first token, per request.",
                              buckets=TTFT_BUCKETS, registry=reg)
        reg.register(EngineCollector(snapshot))

    def observe_request(self, endpoint: str, status: int) -> None:
        """Count one HTTP API request."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def observe_finished(self, delta: Any) -> None:
        """Record a finished engine request (its `StreamDelta`, `stats` may be None)."""
        reason = "error" if getattr(delta, "error", None) else (delta.finish_reason or "unknown")
        self.finished.labels(finish_reason=reason).inc()  # a failed request finishes "abort" with an error
        stats = delta.stats or {}
        self.prompt_tokens.inc(stats.get("prompt_tokens", 0) or 0)
        self.generation_tokens.inc(stats.get("decode_tokens", 0) or 0)
        self.decode_forwards.inc(stats.get("decode_forwards", 0) or 0)
        if stats.get("prefix_cache_hit_tokens"):
            self.prefix_hit_requests.inc()
        if stats.get("decode_forwards"):
            self.tokens_per_forward.observe(float(stats.get("tokens_per_forward") or 0.0))
            self.p_cache.observe(float(stats.get("p_cache") or 0.0))
        if stats.get("ttft_s") is not None:
            self.ttft.observe(float(stats["ttft_s"]))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
