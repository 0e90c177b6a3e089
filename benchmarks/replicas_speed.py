"""Throughput and latency of `wedlm serve` in one process and as 1 or 2 Ray Serve replicas.

    python benchmarks/replicas_speed.py [--requests 64] [--concurrency 8] [--sequential 16] [--cpus 2] [--out-dir docs]

Starts, one after another, three servers of the shipped model (models/wedlm-tiny) on loopback,
each as its own `python -m wedlm.cli.main serve` process sharing `--cpus` CPUs:

* `single`: single-process `wedlm serve`, torch on `--cpus` threads (`OMP_NUM_THREADS`; the
  command has no thread flag);
* `ray1`: one Ray Serve replica on a local Ray instance of `--cpus` CPUs
  (`--min-replicas 1 --max-replicas 1`: `--replicas 1` alone means one process without Ray),
  so the replica runs the same engine on the same threads and the difference from `single`
  is Ray Serve's HTTP proxy and its hop to the replica;
* `ray2`: `--replicas 2` on the same Ray instance size, each replica on `--cpus / 2` threads.

For each: wait for the server (Ray: the command's "serving ... on" line, then `/health`), send
`2 x --concurrency` warm-up chat requests (validation-split prompts), then the measured passes:

* concurrent: `--requests` chat requests, `--concurrency` in flight at any time (httpx async);
  requests/s and completion tokens/s over the pass's wall time, p50/p99 latency per request;
* sequential: `--sequential` requests one at a time, the per-request latency without queueing;
  the proxy's added latency is median(`ray1`) - median(`single`) of this pass (the same prompts);
* `/health`: 50 GET round trips one at a time (no engine work: the HTTP path alone).

Prompts are held-out curriculum items (`wedlm.evaluate.curriculum.heldout_examples`: counting,
two-digit sums/differences and list operations in turn), a different prompt for every request
of a run so the prefix cache cannot favour a pass, chat template, temperature 0, `max_tokens`
64 (long counting answers stop there). Every answer is compared with `single`'s answer to the
same prompt. Each server is stopped with SIGINT; the script waits for it and checks that none of
the processes it had started is left running. With `--out-dir` writes replicas_speed.json and
replicas_speed.md (table, command, machine, date). Nothing here is part of the package.

Raises:
    SystemExit: a server did not start, did not stop cleanly, answered an error, or left a
        process running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from wedlm.bench.report import page_header

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "wedlm-tiny"
HEADER = "x-wedlm-replica"
TASKS = ("count", "addsub", "listops")
READY = re.compile(r"serving \S+ on http://\S+ with (.+)$", re.M)
HEALTH_TRIPS = 50


@dataclass
class Setup:
    """One server to measure: its key, table label and `wedlm serve` options."""

    key: str
    label: str
    args: list[str]
    ray: bool
    threads: int


def setups(cpus: int) -> list[Setup]:
    """The three servers, in the order they run, sharing `cpus` CPUs."""
    per = max(1, cpus // 2)
    return [Setup("single", f"single process, {threads_text(cpus)}", [], False, cpus),
            Setup("ray1", f"Ray Serve, 1 replica x {threads_text(cpus)}",
                  ["--min-replicas", "1", "--max-replicas", "1", "--ray-num-cpus", str(cpus)], True, cpus),
            Setup("ray2", f"Ray Serve, 2 replicas x {threads_text(per)}",
                  ["--replicas", "2", "--ray-num-cpus", str(cpus)], True, per)]


def threads_text(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


# ----- prompts and statistics -----

def prompts(n: int, split: str = "test") -> list[str]:
    """`n` curriculum prompts of `split`, the tasks in turn (count, addsub, listops, count, ...)."""
    from wedlm.data.curriculum import examples

    per = -(-n // len(TASKS))
    pools = [examples(task, per, split) for task in TASKS]
    return [pools[i % len(TASKS)][i // len(TASKS)]["prompt"] for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `values`, linear between the closest ranks (numpy's default).

    Raises:
        ValueError: `values` is empty or `q` is outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in 0..100, got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)


def summarize(latencies: list[float], tokens: list[int], wall: float) -> dict:
    """requests/s, tokens/s, p50/p99/mean latency (ms) of one pass of `len(latencies)` requests
    (seconds each, `tokens` completion tokens each) that took `wall` seconds in all."""
    return {"requests": len(latencies), "wall_s": round(wall, 3), "req_s": len(latencies) / wall,
            "tok_s": sum(tokens) / wall, "tokens": sum(tokens),
            "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
            "mean_ms": 1000 * statistics.fmean(latencies)}


def chat_body(prompt: str, max_tokens: int) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens}


# ----- load -----

async def one_request(http, url: str, body: dict) -> dict:
    """Send one chat request; its latency (s), completion tokens, answer and replica header.

    Raises:
        RuntimeError: a status other than 200.
    """
    start = time.perf_counter()
    r = await http.post(f"{url}/v1/chat/completions", json=body)
    latency = time.perf_counter() - start
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code} from {url}: {r.text[:300]}")
    out = r.json()
    return {"latency": latency, "tokens": out["usage"]["completion_tokens"],
            "text": out["choices"][0]["message"]["content"], "replica": r.headers.get(HEADER, "")}


async def load(url: str, bodies: list[dict], concurrency: int) -> tuple[list[dict], float]:
    """Send `bodies` with at most `concurrency` in flight (`concurrency` workers on a shared list);
    the results in `bodies`' order and the wall time (s) from the first send to the last answer."""
    import httpx

    results: list[dict | None] = [None] * len(bodies)
    todo = iter(range(len(bodies)))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as http:
        async def worker() -> None:
            for i in todo:  # one shared iterator: each index is taken by exactly one worker
                results[i] = await one_request(http, url, bodies[i])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return results, wall


def health_trips(url: str, n: int = HEALTH_TRIPS) -> list[float]:
    """Round-trip times (s) of `n` sequential GET /health."""
    import httpx

    out = []
    with httpx.Client(timeout=60, trust_env=False) as http:
        for _ in range(n):
            start = time.perf_counter()
            r = http.get(f"{url}/health")
            out.append(time.perf_counter() - start)
            if r.status_code != 200:
                raise RuntimeError(f"/health answered {r.status_code}")
    return out


# ----- one server process -----

@dataclass
class Server:
    """A `wedlm serve` process on loopback, started in its own session, logging to `log`."""

    setup: Setup
    log: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    started: list = field(default_factory=list)  # psutil handles of every process below it
    replicas_line: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> float:
        """Start and wait until it answers; the seconds that took.

        Raises:
            RuntimeError: it exited or did not answer `/health` within `timeout` seconds.
        """
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("RAY_ADDRESS", None)  # always a local Ray instance of --cpus CPUs
        env.pop("OMP_NUM_THREADS", None)  # a replica sets its own thread count
        if not self.setup.ray:
            env["OMP_NUM_THREADS"] = str(self.setup.threads)
        cmd = [sys.executable, "-m", "wedlm.cli.main", "serve", "--port", str(self.port), "--max-model-len", "2048",
               "--enforce-eager", "--log-level", "warning", *self.setup.args]
        start = time.perf_counter()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while time.perf_counter() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.setup.key}: wedlm serve exited {self.proc.returncode}:\n{self.tail()}")
            if self.ready():
                self.remember_children()
                return time.perf_counter() - start
            time.sleep(0.5)
        raise RuntimeError(f"{self.setup.key}: not ready after {timeout:.0f} s:\n{self.tail()}")

    def ready(self) -> bool:
        if self.setup.ray:
            match = READY.search(self.log.read_text())
            if not match:
                return False
            self.replicas_line = match.group(1).strip()
        try:
            import httpx

            return httpx.get(f"{self.url}/health", timeout=5, trust_env=False).status_code == 200
        except Exception:  # not listening yet
            return False

    def remember_children(self) -> None:
        import psutil

        found = {p.pid: p for p in self.started}
        found.update({p.pid: p for p in psutil.Process(self.proc.pid).children(recursive=True)})
        self.started = list(found.values())

    def stop(self, timeout: float = 120) -> dict:
        """SIGINT, wait, then check that it and every process it started have exited.

        Returns:
            {"exit_code", "stop_s", "processes", "left_running"}: its exit status, the seconds
            the stop took, how many descendant processes it had, the pids still alive.
        """
        import psutil

        self.remember_children()
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(timeout=30)
        _, alive = psutil.wait_procs(self.started, timeout=10)
        left = [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        return {"exit_code": code, "stop_s": round(time.perf_counter() - start, 2),
                "processes": len(self.started), "left_running": left}

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text()[-chars:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(setup: Setup, a: argparse.Namespace, tmp: Path) -> dict:
    """Start `setup`'s server, warm it up, run the passes, stop it; its result row."""
    server = Server(setup, tmp / f"{setup.key}.log")
    print(f"[{setup.key}] starting: {setup.label}", flush=True)
    startup = server.start()
    try:
        row = run_passes(server.url, a)
    except Exception:
        print(server.tail(), file=sys.stderr)
        raise
    finally:
        stopped = server.stop()
    row.update(key=setup.key, label=setup.label, threads=setup.threads, startup_s=round(startup, 1),
               replicas_line=server.replicas_line, **stopped)
    print(f"[{setup.key}] {row['concurrent']['req_s']:.2f} req/s, {row['concurrent']['tok_s']:.1f} tok/s, "
          f"p50 {row['concurrent']['p50_ms']:.0f} ms, sequential p50 {row['sequential']['p50_ms']:.0f} ms; "
          f"stopped with {stopped['exit_code']} in {stopped['stop_s']} s, left running: {stopped['left_running']}",
          flush=True)
    return row


def run_passes(url: str, a: argparse.Namespace) -> dict:
    """Warm-up, the concurrent pass, the sequential pass and the /health trips against `url`."""
    body = lambda p: chat_body(p, a.max_tokens)  # noqa: E731
    warm = [body(p) for p in prompts(2 * a.concurrency, "val")]
    test = prompts(a.requests + a.sequential)
    asyncio.run(load(url, warm, a.concurrency))
    conc, wall = asyncio.run(load(url, [body(p) for p in test[:a.requests]], a.concurrency))
    seq, seq_wall = asyncio.run(load(url, [body(p) for p in test[a.requests:]], 1))
    trips = health_trips(url)
    return {"concurrent": summarize([r["latency"] for r in conc], [r["tokens"] for r in conc], wall),
            "sequential": summarize([r["latency"] for r in seq], [r["tokens"] for r in seq], seq_wall),
            "health_ms": 1000 * statistics.median(trips),
            "replicas_used": len({r["replica"] for r in conc if r["replica"]}),
            "answers": [r["text"] for r in conc + seq]}


# ----- report -----

def compare(rows: list[dict]) -> list[dict]:
    """Each row with its `answers` replaced by `same_answers` (how many equal the first row's
    answer to the same prompt) and `answers` (how many it gave)."""
    ref = rows[0]["answers"]
    return [{**r, "same_answers": sum(x == y for x, y in zip(r["answers"], ref)), "answers": len(r["answers"])}
            for r in rows]


def findings(rows: list[dict], concurrency: int) -> list[str]:
    """The proxy's added latency (ray1 - single) and the replica scaling (ray2 / ray1, ray2 / single)."""
    by = {r["key"]: r for r in rows}
    out = []
    if "single" in by and "ray1" in by:
        s, r = by["single"], by["ray1"]
        seq = r["sequential"]["p50_ms"] - s["sequential"]["p50_ms"]
        out.append(f"- Ray Serve proxy's added latency per request (sequential median, 1 replica - single "
                   f"process): {seq:+.1f} ms ({seq / s['sequential']['p50_ms']:+.0%}); on /health alone "
                   f"{r['health_ms'] - s['health_ms']:+.1f} ms ({s['health_ms']:.1f} -> {r['health_ms']:.1f} ms).")
        out.append(f"- At concurrency {concurrency}: 1 replica behind the proxy gives "
                   f"{r['concurrent']['req_s'] / s['concurrent']['req_s']:.2f}x the single process's requests/s, "
                   f"p50 {r['concurrent']['p50_ms'] - s['concurrent']['p50_ms']:+.0f} ms.")
    if "ray2" in by:
        two = by["ray2"]["concurrent"]["req_s"]
        for key, what in (("ray1", "1 replica x 2 threads"), ("single", "the single process")):
            if key in by:
                out.append(f"- 2 replicas x 1 thread: {two / by[key]['concurrent']['req_s']:.2f}x the requests/s "
                           f"of {what}.")
    return out


def table(rows: list[dict]) -> str:
    """Markdown: one line per server."""
    out = ["| server | req/s | tok/s | p50 ms | p99 ms | sequential p50 ms | sequential p99 ms | /health ms "
           "| replicas used | same answers as single | start s | clean stop |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c, s = r["concurrent"], r["sequential"]
        clean = "yes" if r["exit_code"] == 0 and not r["left_running"] else \
            f"no (exit {r['exit_code']}, left {r['left_running']})"
        out.append(f"| {r['label']} | {c['req_s']:.2f} | {c['tok_s']:.1f} | {c['p50_ms']:.0f} | {c['p99_ms']:.0f} "
                   f"| {s['p50_ms']:.0f} | {s['p99_ms']:.0f} | {r['health_ms']:.1f} | {r['replicas_used'] or 1} "
                   f"| {r['same_answers']}/{r['answers']} | {r['startup_s']:.0f} | {clean} |")
    return "\n".join(out) + "\n"


def markdown(result: dict) -> str:
    return "\n".join([
        *page_header("Serving replicas: one process vs Ray Serve, 1 and 2 replicas", result),
        f"The shipped model (`models/wedlm-tiny`, eager forward, `--max-model-len 2048`), each server started "
        f"alone on loopback on {result['cpus']} CPUs. Concurrent pass: {result['requests']} chat requests, "
        f"{result['concurrency']} in flight; req/s and completion tok/s over the pass's wall time, p50/p99 of "
        f"each request's latency. Sequential pass: {result['sequential']} other requests one at a time. "
        f"Held-out curriculum prompts (counting, sums/differences, list operations in turn), temperature 0, "
        f"max_tokens {result['max_tokens']}, after {2 * result['concurrency']} warm-up requests. /health: median "
        f"of {HEALTH_TRIPS} sequential round trips. Same answers: equal to the single process's answer to the "
        "same prompt. Clean stop: exit status 0 after SIGINT and none of its processes left running.",
        "",
        table(result["rows"]),
        *findings(result["rows"], result["concurrency"]),
        "",
    ])


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "ray", "httpx"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> str:
    from wedlm.hardware import cpu_model

    return f"{cpu_model()}; {os.cpu_count()} CPUs; {platform.platform()}"


def write_outputs(result: dict, out_dir: Path) -> None:
    """replicas_speed.json and replicas_speed.md under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "replicas_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "replicas_speed.md").write_text(markdown(result))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64, help="requests of the concurrent pass")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight in the concurrent pass")
    ap.add_argument("--sequential", type=int, default=16, help="requests of the sequential pass")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of each server (threads / Ray CPUs)")
    ap.add_argument("--only", nargs="+", choices=("single", "ray1", "ray2"), default=None,
                    help="run only these servers (default: all three)")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    for name in ("requests", "concurrency", "sequential", "max_tokens", "cpus"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    return a


def main() -> None:
    a = parse()
    chosen = [s for s in setups(a.cpus) if a.only is None or s.key in a.only]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            rows = [measure(s, a, Path(tmp)) for s in chosen]
        except RuntimeError as err:
            raise SystemExit(f"replicas_speed: {err}") from None
    rows = compare(rows)
    bad = [r["key"] for r in rows if r["exit_code"] != 0 or r["left_running"]]
    result = {"command": f"python benchmarks/replicas_speed.py {' '.join(sys.argv[1:])}".strip(),
              "machine": machine(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "versions": versions(), "cpus": a.cpus, "requests": a.requests, "concurrency": a.concurrency,
              "sequential": a.sequential, "max_tokens": a.max_tokens, "rows": rows}
    print(markdown(result))
    if a.out_dir:
        write_outputs(result, Path(a.out_dir))
    if bad:
        raise SystemExit(f"replicas_speed: not stopped cleanly: {bad}")


if __name__ == "__main__":
    main()
