"""EngineLoop on a fake engine: one owning thread, ordered deltas, abort, failures, idling."""

import queue
import threading
import time

import pytest
from serve_fake_engine import FakeLLM, FakeParams

from wedlm.serve.engine_loop import EngineLoop
from wedlm.testing import byte_tokenizer


@pytest.fixture
def tok():
    return byte_tokenizer(256)


def run_loop(llm):
    loop = EngineLoop(llm)
    loop.start()
    return loop


def drain(q, timeout=5.0):
    """Deltas from a sink queue until the finished one."""
    out = []
    while True:
        delta = q.get(timeout=timeout)
        out.append(delta)
        if delta.finished:
            return out


def test_deltas_arrive_in_order_and_engine_is_used_from_one_thread(tok):
    llm = FakeLLM(tok, per_step=2)
    loop = run_loop(llm)
    try:
        sinks = [queue.Queue() for _ in range(4)]
        prompts = [list(range(10 + i, 20 + 2 * i)) for i in range(4)]
        for prompt, sink in zip(prompts, sinks):
            loop.submit(prompt, FakeParams(max_tokens=7), sink.put).result(timeout=5)
        for prompt, sink in zip(prompts, sinks):
            deltas = drain(sink)
            assert [t for d in deltas for t in d.new_token_ids] == llm.expected(prompt, 7)
            assert [d.step_index for d in deltas] == list(range(len(deltas)))
            assert deltas[-1].finish_reason == "length" and deltas[-1].stats["decode_tokens"] == 7
        assert len(llm.threads) == 1 and threading.get_ident() not in llm.threads
    finally:
        loop.stop()


def test_abort_sends_a_final_abort_delta_and_frees_the_request(tok):
    llm = FakeLLM(tok, per_step=1, step_sleep=0.01)
    finished = []
    loop = EngineLoop(llm, on_finished=finished.append).start()
    try:
        sink = queue.Queue()
        rid = loop.submit(list(range(100)), FakeParams(max_tokens=100), sink.put).result(timeout=5)
        first = sink.get(timeout=5)
        assert not first.finished
        loop.abort(rid)
        last = drain(sink)[-1]
        assert last.finish_reason == "abort" and last.request_id == rid
        deadline = time.time() + 5
        while loop.snapshot.get("kv_blocks_used") and time.time() < deadline:
            time.sleep(0.01)
        assert not llm.running and loop.snapshot["kv_blocks_used"] == 0 and loop.num_active() == 0
        assert [d.finish_reason for d in finished] == ["abort"]
    finally:
        loop.stop()


def test_engine_refusal_reaches_the_submitter(tok):
    loop = run_loop(FakeLLM(tok, max_model_len=8))
    try:
        with pytest.raises(ValueError, match="max_model_len"):
            loop.submit(list(range(20)), FakeParams(), lambda d: None).result(timeout=5)
    finally:
        loop.stop()


def test_step_failure_fails_running_requests_and_the_loop_keeps_serving(tok):
    llm = FakeLLM(tok, per_step=1, fail_on_step=2)
    loop = run_loop(llm)
    try:
        sink = queue.Queue()
        loop.submit(list(range(30)), FakeParams(max_tokens=20), sink.put).result(timeout=5)
        last = drain(sink)[-1]
        assert last.finish_reason == "abort" and "boom" in last.error
        assert "boom" in loop.last_error
        sink2 = queue.Queue()
        loop.submit([5, 6, 7], FakeParams(max_tokens=3), sink2.put).result(timeout=5)
        assert drain(sink2)[-1].finish_reason == "length"
        assert loop.alive
    finally:
        loop.stop()


def test_idle_loop_blocks_instead_of_stepping(tok):
    llm = FakeLLM(tok)
    loop = run_loop(llm)
    try:
        sink = queue.Queue()
        loop.submit([1, 2, 3], FakeParams(max_tokens=3), sink.put).result(timeout=5)
        drain(sink)
        steps = llm.steps
        cpu = time.thread_time()
        time.sleep(0.3)
        assert llm.steps == steps and loop.alive
        assert time.thread_time() - cpu < 0.1
    finally:
        loop.stop()
    assert not loop.alive
