"""Serving with 2 tensor-parallel ranks (CPU, gloo): the OpenAI client's streams equal the
one-process server's for every decoder, and `wedlm serve --tensor-parallel-size 2` answers,
then stops its worker process on SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest
from tests_serve_util import MAX_MODEL_LEN, MODEL_NAME, make_llm, running_server

DECODERS = ["ar", "wedlm", "blockwise", "verified"]
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def clients(tiny_wedlm):
    """(one-process server client, 2-rank server client) over the same checkpoint."""
    from wedlm.serve import create_app

    one, tp = make_llm(tiny_wedlm), make_llm(tiny_wedlm, tensor_parallel_size=2)
    with running_server(create_app(one, MODEL_NAME)) as url_one, running_server(create_app(tp, MODEL_NAME)) as url_tp:
        yield [openai.OpenAI(base_url=f"{u}/v1", api_key="unused", max_retries=0, timeout=60)
               for u in (url_one, url_tp)]
    tp.close()


def streamed(client, decoding: str, chat: bool) -> list[tuple[str, str | None]]:
    """(text, finish_reason) of every chunk of one greedy streamed request."""
    body = {"decoding": decoding, "wedlm_entropy_threshold": 6.0}
    if chat:
        chunks = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=12,
                                                temperature=0, stream=True, extra_body=body)
        return [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in chunks if c.choices]
    chunks = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=12,
                                       temperature=0, stream=True, extra_body=body)
    return [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks if c.choices]


@pytest.mark.parametrize("decoding", DECODERS)
def test_streams_equal_the_one_process_server(clients, decoding):
    one, tp = clients
    for chat in (False, True):
        want = streamed(one, decoding, chat)
        assert streamed(tp, decoding, chat) == want
        assert want[-1][1] in ("stop", "length") and "".join(t for t, _ in want)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_serve_with_two_ranks_answers_and_stops_its_worker(tiny_wedlm, reference_llm):
    from wedlm import SamplingParams

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wedlm.cli.main", "serve", "--model", str(tiny_wedlm), "--port", str(port),
         "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", MODEL_NAME, "--log-level", "warning",
         "--tensor-parallel-size", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    workers: list[psutil.Process] = []
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.3)
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "wedlm.engine.parallel" in " ".join(c.cmdline())]
        assert len(workers) == 1
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0})
        want = reference_llm.generate(["The quick brown fox"], SamplingParams(temperature=0, max_tokens=8))[0]
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want["text"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
