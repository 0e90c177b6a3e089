"""How long `wedlm serve` takes to be ready, and what its first requests then wait.

Each configuration starts `wedlm serve` in a fresh process (one torch thread, loopback, a free
port) and times, from the process's start:
  * ready: until `GET /health` answers 200 (the port opens after the model loads and, for a
    compiled engine, after `LLM.warm_up` has compiled the forward's graphs);
then, one after another, greedy chat completions of `--max-tokens` tokens:
  * first: one answer ("Count from 1 to 40.");
  * first n=2: two answers of another prompt in one request (a batch of two sequences);
  * steady: the first request again.
A request that has to compile a graph waits for it, and so does every other request in the
engine's loop. The configurations, in order: "cold" (an empty cache folder: no compiled graphs
and, on a CPU, no built C++ operators), "warm" (the same folder again: what a restarted server
pays) and "eager" (`--enforce-eager`).

    python benchmarks/serve_startup.py [--model models/wedlm-tiny] [--max-tokens 64] [--configs cold,warm,eager]

The cache folder is a fresh temporary one ($WEDLM_CACHE, with TORCHINDUCTOR_CACHE_DIR inside it),
so "cold" is cold whatever ~/.cache/wedlm holds; it is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CONFIGS = ("cold", "warm", "eager")
REQUESTS = (("first", "Count from 1 to 40.", 1), ("first n=2", "What is 47 + 38?", 2),
            ("steady", "Count from 1 to 40.", 1))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def chat(base: str, prompt: str, n: int, max_tokens: int) -> tuple[float, list[str]]:
    """Seconds one chat completion took, and its answers."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "n": n}).encode()
    request = urllib.request.Request(f"{base}/v1/chat/completions", body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=900) as response:
        reply = json.loads(response.read())
    return time.perf_counter() - start, [c["message"]["content"] for c in reply["choices"]]


def wait_ready(base: str, server: subprocess.Popen, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"wedlm serve exited with status {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"wedlm serve was not ready after {timeout:.0f} s")


def measure(model: str, config: str, cache: Path, max_tokens: int) -> dict:
    """One server's ready time and request times (`REQUESTS`)."""
    port = free_port()
    env = dict(os.environ, WEDLM_CACHE=str(cache), TORCHINDUCTOR_CACHE_DIR=str(cache / "torch-compile"),
               OMP_NUM_THREADS="1")
    env.pop("WEDLM_ENFORCE_EAGER", None)
    cmd = [sys.executable, "-m", "wedlm.cli.main", "serve", "--model", model, "--port", str(port),
           "--log-level", "warning"] + (["--enforce-eager"] if config == "eager" else [])
    base = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(base, server)
        row = {"config": config, "ready s": time.perf_counter() - start}
        for label, prompt, n in REQUESTS:
            row[f"{label} s"], row[f"{label} answers"] = chat(base, prompt, n, max_tokens)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    return row


def table(rows: list[dict]) -> str:
    head = ["config", "ready s"] + [f"{label} s" for label, _, _ in REQUESTS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join([row["config"]] + [f"{row[k]:.2f}" for k in head[1:]]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "wedlm-tiny"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of cold,warm,eager")
    args = ap.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        ap.error(f"--configs takes a comma-separated subset of {','.join(CONFIGS)}, got {args.configs!r}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="wedlm-serve-startup-") as folder:
        for config in configs:
            rows.append(measure(args.model, config, Path(folder), args.max_tokens))
            print(f"{config}: ready after {rows[-1]['ready s']:.1f} s", file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
