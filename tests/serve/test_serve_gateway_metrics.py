"""The gateway metrics (waiting, running, KV-cache use, prefix-cache hit rate) and their vLLM
aliases move with the engine's state on a real server over the shipped model.

One engine slot (`max_num_seqs=1`) and three long streamed requests: exactly one runs and two
wait; their KV use is the engine's blocks in use over its blocks in all; when the clients
go away everything returns to the idle values (0 waiting, 0 running, 0 KV use: freed blocks
keep their cached content but count as free). A repeated prompt hits the prefix cache and the
hit rate is the exact ratio of the engine's token counters.
"""

import threading
from pathlib import Path

import httpx
from tests_serve_util import make_llm, metric_value, running_server, wait_until

from wedlm.serve import create_app

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
ALIASES = {"vllm:num_requests_waiting": "wedlm_queue_length",
           "vllm:num_requests_running": "wedlm_running_requests",
           "vllm:kv_cache_usage_perc": "wedlm_kv_cache_usage",
           "vllm:prefix_cache_hits_total": "wedlm_prefix_cache_hit_tokens_total",
           "vllm:prefix_cache_queries_total": "wedlm_prefix_cache_queries_total"}
LONG = {"prompt": "Count from 1 to 200.", "max_tokens": 1000, "ignore_eos": True, "temperature": 0,
        "decoding": "ar", "stream": True}


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    names = ["wedlm_queue_length", "wedlm_running_requests", "wedlm_kv_blocks_in_use", "wedlm_kv_blocks_total",
             "wedlm_kv_cache_usage", "wedlm_prefix_cache_hit_rate", "wedlm_prefix_cache_hit_tokens_total",
             "wedlm_prefix_cache_queries_total", *ALIASES]
    return {name: metric_value(text, name) for name in names}


def assert_aliases(m: dict[str, float]) -> None:
    for alias, name in ALIASES.items():
        assert m[alias] == m[name], alias


def hold_stream(url: str, release: threading.Event, first_chunk: list) -> None:
    """Stream a long completion, note its first chunk, and hang up when `release` is set."""
    with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=120) as r:
        lines = r.iter_lines()  # held: a collected iterator would close the connection early
        for line in lines:
            if line.startswith("data: "):
                first_chunk.append(line)
                break
        release.wait(120)


def test_gateway_metrics_follow_a_saturated_engine_back_to_idle():
    app = create_app(make_llm(SHIPPED, max_num_seqs=1, max_model_len=1024), "wedlm-tiny")
    release = threading.Event()
    chunks: list = []
    with running_server(app) as url:
        idle = scrape(url)
        assert idle["wedlm_queue_length"] == 0 and idle["wedlm_running_requests"] == 0
        assert idle["wedlm_kv_cache_usage"] == 0 and idle["wedlm_prefix_cache_hit_rate"] == 0
        assert_aliases(idle)
        threads = [threading.Thread(target=hold_stream, args=(url, release, chunks)) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            assert wait_until(lambda: scrape(url)["wedlm_queue_length"] == 2, timeout=60)
            busy = scrape(url)
            assert busy["wedlm_running_requests"] == 1
            assert busy["wedlm_kv_blocks_in_use"] >= 1
            assert busy["wedlm_kv_cache_usage"] == busy["wedlm_kv_blocks_in_use"] / busy["wedlm_kv_blocks_total"]
            assert 0 < busy["wedlm_kv_cache_usage"] <= 1
            assert_aliases(busy)
            assert wait_until(lambda: len(chunks) >= 1, timeout=60)  # the running one streams
        finally:
            release.set()
            for t in threads:
                t.join(60)
        engine = app.state.server.engine
        assert wait_until(lambda: engine.num_active() == 0 and scrape(url)["wedlm_running_requests"] == 0,
                          timeout=60)
        after = scrape(url)
        assert after["wedlm_queue_length"] == 0 and after["wedlm_kv_cache_usage"] == 0
        assert after["wedlm_kv_blocks_in_use"] == 0
        assert_aliases(after)


def test_prefix_cache_hit_rate_is_the_ratio_of_the_token_counters():
    app = create_app(make_llm(SHIPPED, max_model_len=512, kv_block_size=16), "wedlm-tiny")
    body = {"prompt": list(range(100, 140)), "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    with running_server(app) as url:
        first = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        m1 = scrape(url)
        second = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        m2 = scrape(url)
    prompt = first["usage"]["prompt_tokens"]
    assert prompt == 40 and second["usage"]["prompt_tokens"] == prompt
    assert m1["wedlm_prefix_cache_queries_total"] == prompt and m1["wedlm_prefix_cache_hit_tokens_total"] == 0
    assert m1["wedlm_prefix_cache_hit_rate"] == 0
    hits = second["usage"]["prefix_cache_hit_tokens"]
    assert hits == 32  # the full blocks of the prompt but its last token (computed anew each time)
    assert m2["wedlm_prefix_cache_queries_total"] == 2 * prompt
    assert m2["wedlm_prefix_cache_hit_tokens_total"] == hits
    assert m2["wedlm_prefix_cache_hit_rate"] == hits / (2 * prompt)
    assert_aliases(m2)
