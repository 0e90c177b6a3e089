"""The asyncio side of engine requests: one `RequestGroup` per HTTP request.

An HTTP request becomes one engine request per choice (`n` choices times the prompts of
a batch). The group submits them to the `EngineLoop`, receives their deltas on one
asyncio queue (the loop thread hands them over with `call_soon_threadsafe`), yields
`(choice_index, delta)` in arrival order, and aborts whatever is unfinished when closed
early, e.g. because the client disconnected; the engine then frees their KV blocks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator

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

    Use `await group.submit(...)` per choice, then `async for index, delta in group`,
    and always `group.close()` (idempotent) in a `finally`.
    """

    def __init__(self, engine: EngineLoop, base_id: str):
        self.engine = engine
        self.base_id = base_id
        self.choices: list[Choice] = []
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()

    async def submit(self, prompt_ids: list[int], params: Any) -> Choice:
        """Queue one choice; raises the engine's ValueError when it refuses the request."""
        index = len(self.choices)
        choice = Choice(index, f"{self.base_id}-{index}", prompt_ids)
        self.choices.append(choice)
        future = self.engine.submit(prompt_ids, params, self._sink_for(index), request_id=choice.request_id)
        try:
            choice.request_id = await asyncio.wrap_future(future)
        except BaseException:
            choice.finished = True
            raise
        return choice

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
