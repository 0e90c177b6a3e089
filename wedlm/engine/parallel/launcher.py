"""Rank 0's side of the process model: start ranks 1..N-1, broadcast steps, stop them.

Each rank >= 1 is a child process (`python -m wedlm.engine.parallel`, a
fresh interpreter: no re-import of the caller's main module, nothing pickled
but the step inputs). Rank 0 is the caller's process; it hosts the TCPStore
the group rendezvouses on (port 0: the OS picks a free port, no race).

Lifetime: the workers start with the engine and stop with it. `close()` (and
the garbage collection of the group, and interpreter exit, through
`weakref.finalize`) broadcasts a stop when the group is healthy, then waits,
terminates and kills what is left and releases the store's port. A worker that
exits or fails turns the next (or the current) step into an `EngineDeadError`
naming the rank, its exit status and its error, after which every rank is
stopped; a worker never outlives rank 0 (see `worker.py`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import torch.distributed as dist

from ..runner import EngineDeadError
from .worker import WorkerSpec, join_group

START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 10.0


@dataclass
class _State:
    """Everything the finalizer needs (it must not hold the group object itself)."""

    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    buffers: dict[int, bytes] = field(default_factory=dict)
    store: object = None
    control: object = None
    group_up: bool = False
    busy: bool = False
    error: str | None = None
    closed: bool = False


class WorkerGroup:
    """Ranks 1..N-1 of a tensor-parallel engine and rank 0's membership in their group.

    Args:
        spec: the workers' settings (its `port` is filled in here).
        start_timeout_s: how long loading and joining may take.

    Attributes:
        ready: per rank >= 1, its ready report: {"rank", "pid", "param_bytes", "kv_bytes"}.

    Raises:
        ValueError: this process already belongs to a torch.distributed group.
        RuntimeError: a worker failed or exited while starting (its message included),
            or did not report within `start_timeout_s`; no worker is left running.
    """

    def __init__(self, spec: WorkerSpec, start_timeout_s: float = START_TIMEOUT_S) -> None:
        if dist.is_initialized():
            raise ValueError("tensor_parallel_size > 1 needs a process that is not already in a "
                             "torch.distributed process group")
        self.world_size = spec.world_size
        self._state = state = _State()
        self._finalizer = weakref.finalize(self, _shutdown, state)
        state.store = dist.TCPStore("127.0.0.1", 0, spec.world_size, is_master=True,
                                    timeout=timedelta(seconds=spec.timeout_s), wait_for_workers=False)
        spec.port = state.store.port
        self.port = spec.port
        try:
            for rank in range(1, spec.world_size):
                state.procs[rank] = _spawn(spec, rank)
                state.buffers[rank] = b""
            self.ready = self._wait_ready(start_timeout_s)
            state.control = join_group(spec, 0, state.store)
            state.group_up = True
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..N-1."""
        return [p.pid for p in self._state.procs.values()]

    def begin_step(self, message: object) -> None:
        """Broadcast one step's inputs to every worker (rank 0 then runs the same forward).

        Raises:
            EngineDeadError: a worker is gone or the group is already down.
        """
        state = self._state
        if state.closed:
            raise EngineDeadError(state.error or "the tensor-parallel group is closed")
        dead = [r for r, p in state.procs.items() if p.poll() is not None]
        if dead:
            raise self.fail(None)
        state.busy = True  # from here until end_step the ranks may be inside a collective
        try:
            dist.broadcast_object_list([message], src=0, group=state.control)
        except BaseException as err:
            dead = self.fail(err)
            if isinstance(err, Exception):
                raise dead from err
            raise

    def end_step(self) -> None:
        """Mark the step's collectives finished (a stop may be broadcast again)."""
        self._state.busy = False

    def fail(self, cause: BaseException | None) -> EngineDeadError:
        """Stop every rank and return the error to raise, naming the failed ranks."""
        state = self._state
        if state.error is None:
            deadline = time.monotonic() + 2.0  # let a dying rank finish its report
            while time.monotonic() < deadline and all(p.poll() is None for p in state.procs.values()):
                time.sleep(0.05)
            reports = [self._describe(r) for r in state.procs]
            reports = [r for r in reports if r] or [f"rank 0: {type(cause).__name__}: {cause}"]
            state.error = "tensor-parallel engine is down: " + "; ".join(reports)
        _shutdown(state, graceful=False)
        return EngineDeadError(state.error)

    def close(self) -> None:
        """Stop all workers (gracefully when the group is idle and healthy) and release the port."""
        self._finalizer()

    def _describe(self, rank: int) -> str | None:
        proc = self._state.procs[rank]
        code = proc.poll()
        messages = self._read(rank, timeout=0.0)
        errors = [m["message"] for m in messages if m.get("event") == "error"]
        if code is None and not errors:
            return None
        status = "is running" if code is None else _exit_status(code)
        return f"rank {rank} (pid {proc.pid}) {status}" + (f": {errors[0]}" if errors else "")

    def _wait_ready(self, timeout_s: float) -> dict[int, dict]:
        state, ready = self._state, {}
        deadline = time.monotonic() + timeout_s
        while len(ready) < len(state.procs):
            left = deadline - time.monotonic()
            pending = {state.procs[r].stdout: r for r in state.procs if r not in ready}
            if left <= 0 or not wait(list(pending), timeout=left):
                raise RuntimeError(f"tensor-parallel ranks {sorted(pending.values())} did not load within "
                                   f"{timeout_s:.0f} s")
            for stream in wait(list(pending), timeout=0):
                rank = pending[stream]
                for m in self._read(rank, timeout=0.0):
                    if m.get("event") == "error":
                        raise RuntimeError(f"tensor-parallel rank {rank} failed while loading: {m['message']}")
                    if m.get("event") == "ready":
                        ready[rank] = m
                if rank not in ready and state.procs[rank].poll() is not None:
                    raise RuntimeError(f"tensor-parallel rank {rank} {_exit_status(state.procs[rank].wait())} "
                                       f"while loading")
        return ready

    def _read(self, rank: int, timeout: float) -> list[dict]:
        """Complete JSON lines available on `rank`'s stdout (non-blocking beyond `timeout`)."""
        state = self._state
        stream = state.procs[rank].stdout
        while not stream.closed and wait([stream], timeout=timeout):
            chunk = os.read(stream.fileno(), 1 << 16)
            if not chunk:
                break
            state.buffers[rank] += chunk
            timeout = 0.0
        *lines, state.buffers[rank] = state.buffers[rank].split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def _spawn(spec: WorkerSpec, rank: int) -> subprocess.Popen:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the wedlm package
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else root
    return subprocess.Popen([sys.executable, "-m", "wedlm.engine.parallel", spec.to_json(), str(rank)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _shutdown(state: _State, graceful: bool = True) -> None:
    """Stop every worker and leave the process group; idempotent, never raises."""
    if state.closed:
        return
    state.closed = True
    procs = list(state.procs.values())
    alive = all(p.poll() is None for p in procs)
    if graceful and state.group_up and not state.busy and alive:
        try:
            dist.broadcast_object_list([None], src=0, group=state.control)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for p in procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            pass
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                stream.close()
    if state.group_up:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    state.group_up = False
    state.control = None
    state.store = None
