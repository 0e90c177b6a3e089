"""`wedlm serve` as a real process: it binds loopback, answers /health, /v1/models and a
chat completion, and stops on SIGINT; with $WEDLM_API_KEY it needs the key, and on its
loopback bind it serves only loopback Host names."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_process_answers_and_stops(cli_model):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wedlm.cli.main", "serve", "--model", str(cli_model), "--port", str(port),
         "--max-model-len", "256", "--served-model-name", "tiny", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.3)
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert "WeDLM chat" in httpx.get(url + "/").text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0


def test_serve_process_with_an_api_key_from_the_environment(cli_model):
    port = free_port()
    env = {**os.environ, "WEDLM_API_KEY": "k-123"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "wedlm.cli.main", "serve", "--model", str(cli_model), "--port", str(port),
         "--max-model-len", "256", "--served-model-name", "tiny", "--log-level", "warning",
         "--max-seqs-per-request", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:  # public without the key
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.3)
        assert httpx.post(f"{url}/v1/chat/completions", json=chat).status_code == 401
        keyed = {"Authorization": "Bearer k-123"}
        r = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=keyed, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert httpx.post(f"{url}/v1/chat/completions", json={**chat, "n": 3}, headers=keyed).json()["error"][
            "param"] == "n"
        rebound = httpx.get(f"{url}/health", headers={"Host": "attacker.example"})
        assert rebound.status_code == 421
        assert httpx.get(f"{url}/health", headers={"Host": f"localhost:{port}"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
