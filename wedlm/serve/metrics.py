"""Prometheus metrics of the server (`GET /metrics`), on a registry of its own.

Per-request numbers (tokens, decode forwards, tokens per forward, p_cache of
docs/method.md, "Metrics"; time to first token) are recorded when a request finishes;
engine gauges (queue length, running requests, KV blocks in use, prefix-cache hits) are
read at scrape time from the engine loop's latest `LLM.metrics()` snapshot, so scraping
never touches the engine from another thread. One registry per app keeps several
servers in one process (tests) apart.
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


class EngineCollector:
    """Exports the engine snapshot (a dict from `LLM.metrics()`) at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def collect(self):
        """Yield one metric family per known engine field present in the snapshot."""
        values = self.snapshot() or {}
        for key, (name, kind, help_text) in ENGINE_FIELDS.items():
            if key not in values:
                continue
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            yield family(name, help_text, value=float(values[key]))


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
