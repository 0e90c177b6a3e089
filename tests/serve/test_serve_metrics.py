"""`/metrics` counts every request's work exactly once, however it ends.

A spy around the engine records the final delta of every request (its stats are what
the engine reported); after a mix of finished, disconnected (streamed and plain),
explicitly aborted and failed requests, each Prometheus counter must equal the sum of
those stats, and each request must have been finished exactly once.
"""

import asyncio
import json
import queue
import socket
import threading

import httpx
import pytest
from serve_fake_engine import FakeLLM, FakeParams
from tests_serve_util import MODEL_NAME, make_llm, metric_value, running_server, wait_until

from wedlm.serve import create_app
from wedlm.serve.engine_loop import EngineLoop
from wedlm.testing import byte_tokenizer

COUNTERS = {"wedlm_prompt_tokens_total": "prompt_tokens", "wedlm_generation_tokens_total": "decode_tokens",
            "wedlm_decode_forwards_total": "decode_forwards"}


class Spy:
    """Forwards everything to an engine and records the final delta of every request."""

    def __init__(self, llm):
        self._llm = llm
        self.finals = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def _record(self, delta):
        if delta is not None and delta.finished:
            with self._lock:
                self.finals.append(delta)

    def step(self):
        deltas = self._llm.step()
        for delta in deltas:
            self._record(delta)
        return deltas

    def abort(self, request_id):
        delta = self._llm.abort(request_id)
        self._record(delta)
        return delta

    def totals(self):
        with self._lock:
            return {key: sum(d.stats[key] for d in self.finals) for key in COUNTERS.values()}


def assert_counters_match(spy, text):
    totals = spy.totals()
    for name, key in COUNTERS.items():
        assert metric_value(text, name) == totals[key], name
    ids = [d.request_id for d in spy.finals]
    assert len(ids) == len(set(ids))  # each request finished (and was counted) once


def finished_count(text, reason):
    line = f'wedlm_requests_finished_total{{finish_reason="{reason}"}} '
    return sum(float(row.rsplit(" ", 1)[1]) for row in text.splitlines() if row.startswith(line))


def read_chunks_then_close(url, body, chunks):
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        for _ in range(chunks):
            next(lines)


def test_fake_engine_counters_equal_the_reported_stats():
    tok = byte_tokenizer(256)
    spy = Spy(FakeLLM(tok, per_step=1, step_sleep=0.01))
    app = create_app(spy, "fake", sampling_params_cls=FakeParams)
    with running_server(app) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "abcdef", "max_tokens": 4})
        assert r.json()["usage"]["completion_tokens"] == 4
        read_chunks_then_close(url, {"prompt": "x" * 100, "max_tokens": 100}, chunks=5)
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"prompt": "y" * 60, "max_tokens": 60}).encode()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            # this request (60 prompt tokens), not the streamed one that may still be running
            assert wait_until(lambda: any(len(r.prompt) == 60 and r.done >= 3 for r in list(spy._llm.running.values())))
        assert wait_until(lambda: not spy._llm.running and app.state.server.engine.num_active() == 0)
        spy._llm.fail_on_done = 3  # the engine raises mid-request, after its third token
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "z" * 30, "max_tokens": 30})
        assert r.status_code == 500
        text = httpx.get(f"{url}/metrics").text
    reasons = sorted(d.finish_reason for d in spy.finals)
    assert reasons == ["abort", "abort", "abort", "length"]
    assert_counters_match(spy, text)
    assert spy.totals()["prompt_tokens"] == 6 + 100 + 60 + 30
    assert finished_count(text, "abort") == 2 and finished_count(text, "error") == 1
    aborted = [d for d in spy.finals if d.finish_reason == "abort"]
    assert all(d.stats["decode_tokens"] >= 3 for d in aborted)  # work done before the end is counted
    assert 3 in [d.stats["decode_tokens"] for d in aborted]  # the request the engine failed on


def test_loop_abort_delivers_the_engine_report_with_its_stats():
    tok = byte_tokenizer(256)
    llm = FakeLLM(tok, per_step=1, step_sleep=0.01)
    finished = []
    loop = EngineLoop(llm, on_finished=finished.append).start()
    try:
        sink = queue.Queue()
        rid = loop.submit(list(range(50)), FakeParams(max_tokens=50), sink.put).result(timeout=5)
        assert wait_until(lambda: sink.qsize() >= 3)
        loop.abort(rid)
        assert wait_until(lambda: finished)
    finally:
        loop.stop()
    (final,) = finished
    assert final.finish_reason == "abort" and final.stats["prompt_tokens"] == 50
    assert final.stats["decode_tokens"] == final.stats["decode_forwards"] >= 3  # one token per step


@pytest.mark.parametrize("decoding", ["ar", "wedlm"])
def test_real_engine_counters_equal_the_reported_stats(tiny_wedlm, decoding):
    spy = Spy(make_llm(tiny_wedlm))
    app = create_app(spy, MODEL_NAME)
    long = {"decoding": decoding, "ignore_eos": True, "temperature": 0, "max_tokens": 120}
    with running_server(app) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "temperature": 0,
            "ignore_eos": True, "decoding": decoding})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
        read_chunks_then_close(url, {"prompt": "count with me", **long}, chunks=3)
        assert wait_until(lambda: app.state.server.engine.num_active() == 0 and not spy.has_unfinished())

        async def two_at_once():
            async with httpx.AsyncClient(timeout=60) as http:
                body = {"prompt": "abc", "max_tokens": 5, "temperature": 0, "decoding": decoding}
                return await asyncio.gather(*(http.post(f"{url}/v1/completions", json=body) for _ in range(2)))

        assert [r.status_code for r in asyncio.run(two_at_once())] == [200, 200]
        text = httpx.get(f"{url}/metrics").text
    assert sorted(d.finish_reason for d in spy.finals)[0] == "abort" and len(spy.finals) == 4
    aborted = next(d for d in spy.finals if d.finish_reason == "abort")
    assert aborted.stats["decode_tokens"] >= 3 and aborted.stats["decode_forwards"] >= 1
    assert_counters_match(spy, text)
