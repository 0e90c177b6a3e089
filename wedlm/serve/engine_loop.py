"""The one thread that owns the engine: every HTTP request shares its continuous batching.

`LLM` is not thread-safe, so a single `EngineLoop` thread does all of `add_request`,
`abort`, `step` and `metrics`. Other threads talk to it through a command queue and get
per-step `StreamDelta`s back through a `sink` callback (the server wraps it with
`loop.call_soon_threadsafe` onto a per-request asyncio queue). When no request is
running, the thread blocks on the command queue, so an idle server burns no CPU.

There is one abort path: `LLM.abort` returns the request's final "abort" `StreamDelta`,
stats included (prompt tokens, generated tokens and forwards used until then), and the
loop hands exactly that delta to the request's sink and to `on_finished`, so an aborted,
disconnected or failed request is counted once like a finished one. Only when the engine
no longer knows the request (it lost it, or the engine itself is broken) does the loop
make the final delta itself, without stats.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from ..engine.outputs import StreamDelta

log = logging.getLogger(__name__)

Sink = Callable[[Any], None]


@dataclass(slots=True)
class _Add:
    prompt: str | list[int]
    params: Any
    request_id: str
    sink: Sink
    done: Future


@dataclass(slots=True)
class _Abort:
    request_id: str


@dataclass(slots=True)
class _Stop:
    pass


class EngineLoop:
    """Runs `llm.step()` on a daemon thread while any request is unfinished.

    Args:
        llm: a `wedlm.LLM` (or anything with its `add_request/step/abort/
            has_unfinished/metrics` contract); used only from this loop's thread.
        on_finished: called on the loop thread with each finished delta (metrics).
    """

    def __init__(self, llm: Any, on_finished: Callable[[Any], None] | None = None):
        self.llm = llm
        self.on_finished = on_finished
        self._commands: queue.Queue = queue.Queue()
        self._sinks: dict[str, Sink] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self.snapshot: dict[str, Any] = {}
        self.steps = 0
        self.last_error: str | None = None

    # ----- API for other threads -----
    def start(self) -> EngineLoop:
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._refresh_snapshot()
            self._thread = threading.Thread(target=self._run, name="wedlm-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything still running and join the thread."""
        if self._thread is not None:
            self._commands.put(_Stop())
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        """Whether the loop thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, prompt: str | list[int], params: Any, sink: Sink,
               request_id: str | None = None) -> Future:
        """Queue a request; the future resolves to its id or to the engine's ValueError.

        `sink(delta)` is then called on the loop thread for every delta of the request,
        the last one with `finished=True`.
        """
        done: Future = Future()
        rid = request_id or f"req-{next(self._ids)}"
        self._commands.put(_Add(prompt, params, rid, sink, done))
        return done

    def abort(self, request_id: str) -> None:
        """Ask the loop to abort a request (no-op when it already finished)."""
        self._commands.put(_Abort(request_id))

    def num_active(self) -> int:
        """Requests the loop still holds a sink for."""
        return len(self._sinks)

    # ----- loop thread -----
    def _run(self) -> None:
        while True:
            idle = not self._engine_busy()
            if idle and self._sinks:
                self._abort_all("the engine dropped the request")
            try:
                command = self._commands.get(block=idle)
            except queue.Empty:
                command = None
            while command is not None:
                if isinstance(command, _Stop):
                    self._abort_all("server shutting down")
                    return
                self._handle(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if self._engine_busy():
                self._step()
            self._refresh_snapshot()

    def _engine_busy(self) -> bool:
        try:
            return bool(self.llm.has_unfinished())
        except Exception:  # a broken engine must not kill the loop
            log.exception("has_unfinished failed")
            return False

    def _handle(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            self._abort(command.request_id, None)
            return
        if not command.done.set_running_or_notify_cancel():
            return
        try:
            rid = self.llm.add_request(command.prompt, command.params, request_id=command.request_id)
        except Exception as err:  # ValueError from validation; anything else is reported too
            command.done.set_exception(err)
            return
        self._sinks[rid] = command.sink
        command.done.set_result(rid)

    def _step(self) -> None:
        started = time.perf_counter()
        try:
            deltas = self.llm.step()
        except Exception as err:
            log.exception("engine step failed")
            self.last_error = f"{type(err).__name__}: {err}"
            self._abort_all(f"engine step failed: {self.last_error}")
            return
        self.steps += 1
        for delta in deltas:
            self._deliver(delta)
        log.debug("step %d: %d deltas in %.1f ms", self.steps, len(deltas),
                  1e3 * (time.perf_counter() - started))

    def _deliver(self, delta: Any) -> None:
        sink = self._sinks.get(delta.request_id)
        if sink is None:  # e.g. the engine's own report of a request this loop already aborted
            return
        if delta.finished:
            del self._sinks[delta.request_id]
            if self.on_finished is not None:
                self._safe(self.on_finished, delta)
        self._safe(sink, delta)

    def _abort(self, request_id: str, error: str | None) -> None:
        sink = self._sinks.pop(request_id, None)
        delta = None
        try:
            delta = self.llm.abort(request_id)
        except Exception:
            log.exception("abort of %s failed", request_id)
        if sink is None:
            return
        if not isinstance(delta, StreamDelta):  # the engine lost the request: nothing to count
            delta = StreamDelta(request_id, [], "", True, "abort", -1)
        if error is not None:
            delta = replace(delta, error=error)
        if self.on_finished is not None:
            self._safe(self.on_finished, delta)
        self._safe(sink, delta)

    def _abort_all(self, error: str) -> None:
        for request_id in list(self._sinks):
            self._abort(request_id, error)

    def _refresh_snapshot(self) -> None:
        try:
            self.snapshot = dict(self.llm.metrics())
        except Exception:
            log.exception("metrics failed")

    @staticmethod
    def _safe(fn: Callable[[Any], None], delta: Any) -> None:
        try:
            fn(delta)
        except Exception:
            log.exception("delta callback failed for %s", getattr(delta, "request_id", "?"))
