"""`wedlm serve --replicas 2` on a local Ray instance: two CPU replicas of the shipped model
behind one endpoint answer exactly like single-process serving, a killed replica is replaced
while the other keeps answering, and stopping the command leaves no Ray process behind.

The command runs as a real process with `--ray-num-cpus 2` (one CPU, one torch thread per
replica). Skipped without Ray Serve (`pip install "wedlm[ray]"`); slow (Ray's start-up and a
replica restart take a minute or more on two busy cores).
"""

import asyncio
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
from tests_serve_util import make_llm, metric_value, running_server, wait_until

pytest.importorskip("ray.serve")
psutil = pytest.importorskip("psutil")

from wedlm.serve import create_app  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models" / "wedlm-tiny"
HEADER = "x-wedlm-replica"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def requests_40() -> list[dict]:
    """40 chat requests (every other one streamed) of the shipped model's counting task."""
    out = []
    for i in range(40):
        body = {"model": "wedlm-tiny", "messages": [{"role": "user", "content": f"Count from 1 to {5 + i % 10}."}],
                "temperature": 0, "max_tokens": 48, "stream": i % 2 == 1}
        out.append(body)
    return out


async def send_all(url: str, bodies: list[dict]) -> list[tuple[int, str, str]]:
    """(status, answer text, replica header) of each request, sent all at once."""
    async with httpx.AsyncClient(timeout=300) as http:
        return await asyncio.gather(*(send_one(http, url, body) for body in bodies))


async def send_one(http: httpx.AsyncClient, url: str, body: dict) -> tuple[int, str, str]:
    if not body["stream"]:
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        return r.status_code, r.json()["choices"][0]["message"]["content"], r.headers.get(HEADER, "")
    text, done = "", False
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        assert done, "stream ended without [DONE]"
        return r.status_code, text, r.headers.get(HEADER, "")


def pid_of(replica: str) -> int:
    """The process id in an `x-wedlm-replica: <id>@<host>:<pid>` value."""
    return int(replica.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def reference_answers():
    """The same 40 requests answered by single-process serving (one engine, in this process)."""
    app = create_app(make_llm(SHIPPED, max_model_len=2048), "wedlm-tiny")
    with running_server(app) as url:
        return [text for _, text, _ in asyncio.run(send_all(url, requests_40()))]


def test_two_ray_replicas_answer_recover_and_stop_cleanly(reference_answers, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)  # a local instance, whatever the caller has set
    proc = subprocess.Popen(
        [sys.executable, "-m", "wedlm.cli.main", "serve", "--replicas", "2", "--ray-num-cpus", "2",
         "--port", str(port), "--max-model-len", "2048", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ray_processes: dict[int, psutil.Process] = {}
    try:
        # the command says so once Ray Serve reports every replica running
        assert wait_until(lambda: ready(tmp_path / "serve.log", proc), timeout=300, interval=0.5), \
            (tmp_path / "serve.log").read_text()[-3000:]
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        results = asyncio.run(send_all(url, requests_40()))
        assert [status for status, _, _ in results] == [200] * 40
        assert [text for _, text, _ in results] == reference_answers
        assert "1, 2, 3, 4, 5" in reference_answers[0]
        replicas = {replica for _, _, replica in results}
        assert len(replicas) == 2, replicas  # both replicas served
        ray_processes = {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
        assert {pid_of(r) for r in replicas} <= set(ray_processes)

        assert_disconnect_aborts(url)
        victim, survivor = kill_during_a_stream(url)
        assert victim in replicas and survivor in replicas - {victim}
        # the other replica keeps answering while Ray replaces the killed one
        for _ in range(4):
            r = httpx.get(f"{url}/v1/models", timeout=30)
            assert r.status_code == 200 and r.headers[HEADER] in (survivor, *new_names(r, replicas))
        assert wait_until(lambda: new_replica_serves(url, replicas), timeout=240, interval=1.0)
        ray_processes.update({p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)})
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
    left = [p.pid for p in ray_processes.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert ray_processes and left == []


def ready(log: Path, proc: subprocess.Popen) -> bool:
    assert proc.poll() is None, "wedlm serve exited:\n" + log.read_text()[-3000:]
    return "serving wedlm-tiny on http://" in log.read_text()


def assert_disconnect_aborts(url: str) -> None:
    """A client that hangs up mid-stream frees its replica: every replica's running count returns to 0."""
    body = {"prompt": "Count", "max_tokens": 400, "ignore_eos": True, "decoding": "ar", "stream": True,
            "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        holder = r.headers[HEADER]
    idle = {}

    def all_idle() -> bool:
        r = httpx.get(f"{url}/metrics", timeout=10)
        idle[r.headers[HEADER]] = metric_value(r.text, "wedlm_running_requests") == 0
        return holder in idle and all(idle.values())

    assert wait_until(all_idle, timeout=60, interval=0.2)


def kill_during_a_stream(url: str) -> tuple[str, str]:
    """Kill the replica holding a running stream while long un-streamed requests run on both
    replicas. The stream ends as a single server ends a failed one (an error event, then
    `[DONE]`); an un-streamed request the dead replica held is retried on the other one (200)
    or, when it fails again, gets an OpenAI 503. Returns (killed replica, the other replica)."""
    body = {"prompt": "Count", "max_tokens": 2000, "ignore_eos": True, "decoding": "ar", "temperature": 0}
    answers: list[httpx.Response] = []
    senders = [threading.Thread(target=lambda: answers.append(
        httpx.post(f"{url}/v1/completions", json=body, timeout=300))) for _ in range(3)]
    for sender in senders:  # the router sends each to the less loaded replica: both get some
        sender.start()
        time.sleep(0.2)
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=300) as r:
        victim = r.headers[HEADER]
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(pid_of(victim), signal.SIGKILL)
        tail = [line for line in lines if line.startswith("data: ")]
    assert tail[-1] == "data: [DONE]"
    assert json.loads(tail[-2][len("data: "):])["error"]["type"] == "server_error"
    for sender in senders:
        sender.join(300)
    assert len(answers) == 3
    others = {r.headers[HEADER] for r in answers if r.status_code == 200}
    failed = [r for r in answers if r.status_code != 200]
    assert all(r.status_code == 503 and r.json()["error"]["type"] == "server_error" for r in failed)
    assert victim not in others and len(others) == 1
    return victim, others.pop()


def new_names(r: httpx.Response, old: set[str]) -> list[str]:
    """The replica header of `r` when it names a replica started since (the replacement)."""
    return [r.headers[HEADER]] if r.headers[HEADER] not in old else []


def new_replica_serves(url: str, old: set[str]) -> bool:
    try:
        r = httpx.get(f"{url}/v1/models", timeout=10)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and r.headers.get(HEADER) not in old
