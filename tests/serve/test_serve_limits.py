"""Work limits and fairness: a prompt that cannot fit is refused from its length before
any tokenizing, prompts x n per request and the sequences held at once are capped (400,
429 with Retry-After), tokenizing runs on the tokenizer thread, never the event loop's;
and (slow) another client's stream keeps flowing while 4M-character prompts are refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_fake_engine import FakeLLM, FakeParams
from tests_serve_util import MAX_MODEL_LEN, MODEL_NAME, running_server, wait_until

from wedlm.serve import create_app
from wedlm.serve.limits import NORMALIZER_SLACK, ServeLimits
from wedlm.testing import byte_tokenizer

REPO = Path(__file__).resolve().parents[2]
FOUR_MILLION = 4_000_000


@pytest.fixture
def spied(server):
    """(base_url, calls): every call of the server's tokenizer as (method, thread name)."""
    tokenizer = server[1].state.server.prompts.tokenizer
    calls = []
    originals = {}
    for name in ("encode", "apply_chat_template", "decode"):
        originals[name] = getattr(tokenizer, name)

        def spy(*args, _name=name, **kwargs):
            calls.append((_name, threading.current_thread().name))
            return originals[_name](*args, **kwargs)

        setattr(tokenizer, name, spy)
    yield server[0], calls
    for name in originals:
        delattr(tokenizer, name)


def post(url, path, body, **kwargs):
    return httpx.post(url + path, content=json.dumps(body), headers={"Content-Type": "application/json"},
                      timeout=60, **kwargs)


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(spied, server):
    url, calls = spied
    limit = MAX_MODEL_LEN * 13 * NORMALIZER_SLACK  # the byte tokenizer's longest entry: <|endoftext|>
    assert server[1].state.server.bound.max_chars == limit
    chat = post(url, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x" * FOUR_MILLION}], "max_tokens": 2})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert chat.json()["error"]["message"] == (
        f"Invalid value for 'messages': the messages' content has {FOUR_MILLION} characters; at most {limit} "
        f"can fit max_model_len {MAX_MODEL_LEN} (one token covers at most {13 * NORMALIZER_SLACK} characters)")
    for prompt in ("y" * (limit + 1), ["ok", "z" * (limit + 1)]):
        r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    ids = post(url, "/v1/completions", {"prompt": [7] * MAX_MODEL_LEN, "max_tokens": 2})
    assert ids.status_code == 400 and "fits at most 255" in ids.json()["error"]["message"]
    many = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": ""}] * MAX_MODEL_LEN})
    assert many.status_code == 400 and many.json()["error"]["param"] == "messages"
    assert calls == []  # nothing was tokenized or rendered


def test_prompts_times_n_is_capped_before_tokenizing(spied):
    url, calls = spied
    r = post(url, "/v1/completions", {"prompt": ["a"] * 2048, "n": 16, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert r.json()["error"]["message"] == ("Invalid value for 'prompt': 2048 prompt(s) x n=16 is 32768 sequences; "
                                            "at most 256 per request (max_seqs_per_request)")
    assert calls == []
    ok = post(url, "/v1/completions", {"prompt": ["a"] * 16, "n": 16, "max_tokens": 1, "temperature": 0})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 256


def test_tokenizing_runs_on_the_tokenizer_thread(spied):
    url, calls = spied
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    done = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 2, "echo": True})
    assert chat.status_code == done.status_code == 200
    assert {name for name, _ in calls} == {"apply_chat_template", "encode", "decode"}
    assert all(thread.startswith("wedlm-tokenizer") for _, thread in calls), calls


def fake_app(**limits):
    llm = FakeLLM(byte_tokenizer(256), per_step=1, step_sleep=0.05)
    return llm, create_app(llm, "fake", sampling_params_cls=FakeParams, limits=ServeLimits(**limits))


def test_held_sequences_are_capped_with_429_and_retry_after():
    llm, app = fake_app(max_queued_seqs=4, max_seqs_per_request=4)
    server = app.state.server
    with running_server(app) as url:
        n_cap = post(url, "/v1/completions", {"prompt": "abc", "n": 5, "max_tokens": 2})
        assert n_cap.status_code == 400 and n_cap.json()["error"]["param"] == "n"
        long = {"prompt": "abcdefghij" * 20, "n": 3, "max_tokens": 50, "stream": True}  # 50 steps of 50 ms
        with httpx.stream("POST", url + "/v1/completions", timeout=60, headers={"Content-Type": "application/json"},
                          content=json.dumps(long)) as s:
            lines = s.iter_lines()  # kept: a dropped iterator closes the connection
            assert next(lines).startswith("data: ")
            assert server.admission.held == 3
            busy = post(url, "/v1/completions", {"prompt": "xy", "n": 2, "max_tokens": 2})
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"] == {
                "message": "The server holds 3 sequences and at most 4 (max_queued_seqs); retry in 1 s",
                "type": "rate_limit_error", "param": None, "code": "server_busy"}
            fits = post(url, "/v1/completions", {"prompt": "xy", "max_tokens": 2})
            assert fits.status_code == 200 and fits.json()["choices"][0]["text"] == "yx"
        # the client left mid-stream: its sequences are aborted and released
        assert wait_until(lambda: server.admission.held == 0 and not llm.running)
        again = post(url, "/v1/completions", {"prompt": "xy", "n": 2, "max_tokens": 2})
        assert again.status_code == 200 and server.admission.held == 0


def test_a_request_no_retry_could_admit_is_a_400():
    """More sequences than `max_queued_seqs` can never be held at once: a 400 naming the field and
    the limit, not a 429 whose retries would never clear (clients retry 429s by themselves)."""
    llm, app = fake_app(max_queued_seqs=2, max_seqs_per_request=8)
    with running_server(app) as url:
        too_many = post(url, "/v1/completions", {"prompt": "abc", "n": 3, "max_tokens": 2})
        assert too_many.status_code == 400 and too_many.json()["error"] == {
            "message": "Invalid value for 'n': 1 prompt(s) x n=3 is 3 sequences; at most 2 per request "
                       "(max_queued_seqs)", "type": "invalid_request_error", "param": "n", "code": None}
        batch = post(url, "/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 2})
        assert batch.status_code == 400 and batch.json()["error"]["param"] == "prompt"
        fits = post(url, "/v1/completions", {"prompt": "xy", "n": 2, "max_tokens": 2})
        assert fits.status_code == 200 and app.state.server.admission.held == 0


def test_refused_and_failed_requests_release_what_they_held():
    llm, app = fake_app(max_queued_seqs=2)
    server = app.state.server
    with running_server(app) as url:
        for body in ({"prompt": "abc", "max_tokens": 10_000}, {"prompt": "abc", "temperature": -1, "n": 2},
                     {"prompt": [1, 2], "max_tokens": 2, "n": 2}):
            assert post(url, "/v1/completions", body).status_code in (200, 400)
            assert server.admission.held == 0
        with httpx.stream("POST", url + "/v1/completions", headers={"Content-Type": "application/json"},
                          content=json.dumps({"prompt": "abcdefgh" * 4, "n": 2, "max_tokens": 32, "stream": True}),
                          timeout=60) as s:
            next(s.iter_lines())  # the iterator is dropped: the connection closes after the first event
        assert wait_until(lambda: server.admission.held == 0 and not llm.running)


@pytest.mark.parametrize("limits, message", [
    ({"max_seqs_per_request": 0}, "max_seqs_per_request must be an integer >= 1, got 0"),
    ({"max_queued_seqs": True}, "max_queued_seqs must be an integer >= 1, got True"),
])
def test_limits_are_checked_once(limits, message):
    with pytest.raises(ValueError) as err:
        ServeLimits(**limits)
    assert str(err.value) == message


# ----- the fairness measurement (a real `wedlm serve` process over the shipped model) -----
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stream_gaps(url: str, tokens: int, on_first=None) -> list[float]:
    """Arrival gaps (s) between the chunks of one streamed AR answer of `tokens` tokens;
    `on_first()` is called when the first chunk arrives."""
    body = {"prompt": "Count from 1 to 200.", "max_tokens": tokens, "decoding": "ar", "ignore_eos": True,
            "temperature": 0, "stream": True}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                times.append(time.perf_counter())
                if on_first and len(times) == 1:
                    on_first()
    return [b - a for a, b in zip(times, times[1:])]


def abuse(url: str, rounds: int, health: list[float]) -> None:
    """Send 4M-character chat and completion prompts (refused), timing /health after each."""
    chat = json.dumps({"messages": [{"role": "user", "content": "x" * FOUR_MILLION}]}).encode()
    completion = json.dumps({"prompt": "x" * FOUR_MILLION}).encode()
    with httpx.Client(base_url=url, timeout=120, headers={"Content-Type": "application/json"}) as http:
        for _ in range(rounds):
            for path, raw in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
                r = http.post(path, content=raw)
                assert r.status_code == 400 and r.json()["error"]["param"] in ("messages", "prompt"), r.text[:300]
                began = time.perf_counter()
                assert http.get("/health").status_code == 200
                health.append(time.perf_counter() - began)


def measure(url: str, rounds: int, tokens: int) -> tuple[float, float, float]:
    """(max gap alone, max gap while another client's 4M-character prompts are refused, max
    /health latency meanwhile), seconds; the abusive client is a thread of its own, so its
    uploads do not delay the streaming client's reads."""
    quiet = stream_gaps(url, tokens)
    health: list[float] = []
    abuser = threading.Thread(target=abuse, args=(url, rounds, health))
    loaded = stream_gaps(url, tokens, on_first=abuser.start)
    abuser.join()
    assert len(health) == 2 * rounds  # every abusive request was refused (a failed assert stops the thread)
    return max(quiet), max(loaded), max(health)


@pytest.mark.slow
def test_a_stream_keeps_flowing_while_huge_prompts_are_refused():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wedlm.cli.main", "serve", "--port", str(port),
                             "--served-model-name", MODEL_NAME, "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: proc.poll() is None and _healthy(url), timeout=120, interval=0.5)
        quiet, loaded, health = measure(url, rounds=3, tokens=400)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
    print(f"max inter-chunk gap: {quiet:.3f} s alone, {loaded:.3f} s during 4M-character prompts; "
          f"max /health latency {health:.3f} s")
    assert "Traceback" not in out, out
    assert loaded < max(0.5, 2 * quiet), (quiet, loaded)
    assert health < 0.5


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
