"""Helpers shared by the serving tests: uvicorn on loopback in a thread, engines, metrics.

`running_server(app)` serves an app from a background thread on a socket bound to
127.0.0.1:0 (no port race) and yields its base URL.
"""

import contextlib
import socket
import threading
import time

MODEL_NAME = "wedlm-test"
MAX_MODEL_LEN = 256


@contextlib.contextmanager
def running_server(app):
    """Serve `app` with uvicorn on loopback; yields "http://127.0.0.1:PORT"."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def make_llm(path, **kwargs):
    """A CPU `wedlm.LLM` over `path` (an import error fails the test; it is never skipped)."""
    from wedlm import LLM

    kwargs.setdefault("max_model_len", MAX_MODEL_LEN)
    return LLM(model=str(path), device="cpu", dtype="float32", **kwargs)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; its last value."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return bool(value)
        time.sleep(interval)


def metric_value(text: str, name: str) -> float:
    """The value of an unlabelled (or first labelled) sample `name` in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
