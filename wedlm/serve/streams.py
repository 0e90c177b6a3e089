"""The asyncio side of engine requests: one `RequestGroup` per HTTP request.

An HTTP request becomes one engine request per choice (`n` choices times the prompts of
a batch). The group submits them to the `EngineLoop`, receives their deltas on one
asyncio queue (the loop thread hands them over with `call_soon_threadsafe`), yields
`(choice_index, delta)` in arrival order, and aborts whatever is unfinished when closed
early, e.g. because the client disconnected; the engine then frees their KV blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .engine_loop import EngineLoop


@dataclass(slots=True)
class Choice:
    """One engine request of a group."""

    index: int
    request_id: str
    prompt_ids: list[int]
    finished: bool = False


class RequestGroup:
    """The engine requests behind one HTTP request.

    Use `await group.submit([...])`, then `async for index, delta in group`, and always
    `group.close()` (idempotent) in a `finally`.
    """

    def __init__(self, engine: EngineLoop, base_id: str):
        self.engine = engine
        self.base_id = base_id
        self.choices: list[Choice] = []
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()

    async def submit(self, requests: list[tuple[list[int], Any]]) -> list[Choice]:
        """Queue one choice per (prompt ids, params) at once, then wait for the engine to take them.

        All commands go onto the loop's queue together, so they join the same engine step.

        Raises:
            ValueError: the engine refused one; the others are aborted (the group is closed).
        """
        futures = []
        for prompt_ids, params in requests:
            index = len(self.choices)
            choice = Choice(index, f"{self.base_id}-{index}", prompt_ids)
            self.choices.append(choice)
            futures.append(self.engine.submit(prompt_ids, params, self._sink_for(index),
                                              request_id=choice.request_id))
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for choice, result in zip(self.choices[-len(futures):], results):
            if isinstance(result, BaseException):
                choice.finished = True  # never admitted: nothing to abort
            else:
                choice.request_id = result
        if failures:
            self.close()
            raise failures[0]
        return self.choices[-len(futures):]

    def _sink_for(self, index: int):
        def sink(delta: Any) -> None:
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, delta))
            except RuntimeError:  # the event loop is closed: nobody is listening
                pass
        return sink

    async def __aiter__(self) -> AsyncIterator[tuple[int, Any]]:
        while not all(choice.finished for choice in self.choices):
            index, delta = await self._queue.get()
            if delta.finished:
                self.choices[index].finished = True
            yield index, delta

    def close(self) -> None:
        """Abort every unfinished choice (their KV blocks are freed by the engine)."""
        for choice in self.choices:
            if not choice.finished:
                choice.finished = True
                self.engine.abort(choice.request_id)


async def abort_on_disconnect(request: Any, group: RequestGroup) -> None:
    """Wait for the client's `http.disconnect` and abort the group (non-streaming requests).

    Run as a task next to the handler and cancel it when the handler returns.
    """
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            group.close()
            return
