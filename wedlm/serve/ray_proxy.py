"""Ray Serve proxy middleware: a replica that dies mid-request fails the request the way a
single `wedlm serve` fails one, and a request it held before answering is retried once.

Ray Serve's HTTP proxy sends nothing for a request whose replica died before responding
(uvicorn then answers a plain-text `500 Internal Server Error`), and cuts a response already
under way (an SSE stream loses its end). `ReplicaFailover` wraps the proxy's ASGI app:

- nothing sent to the client yet and no answer, or the proxy's own 500 (no `x-wedlm-replica`
  header, not JSON: no replica wrote it): the request is sent again once, with its recorded body; a
  second such failure becomes an OpenAI error body, status 503 (`type: "server_error"`);
- another 5xx of the proxy's own (overload, no replica available): the same status with an
  OpenAI error body instead of plain text;
- an SSE response cut before its last byte: a `data: {"error": {...}}` event, then
  `data: [DONE]`, as a request failing mid-stream gets from one process.

A client that disconnects gets nothing more and nothing is retried. Ray Serve loads it from
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=wedlm.serve.ray_proxy:middlewares` in the
environment of the Ray processes (`run_cluster` sets it for the Ray instance it starts).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from . import protocol
from .errors import error_body

log = logging.getLogger(__name__)
REPLICA_HEADER = b"x-wedlm-replica"
IMPORT_PATH = "wedlm.serve.ray_proxy:middlewares"
REPLICA_LOST = "the replica serving this request stopped before it finished; please retry"


def middlewares() -> list:
    """Ray Serve's HTTP proxy callback: the middlewares to wrap the proxy with."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaFailover)]


class ReplicaFailover:
    """ASGI middleware around Ray Serve's proxy (see the module docstring)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = RecordedBody(receive)
        attempt = await self.attempt(scope, body, send)
        if attempt.held is not None and attempt.held["status"] == 500 and not body.disconnected:
            attempt = await self.attempt(scope, body, send)  # the replica died before answering: once more
        await attempt.finish(body.disconnected)

    async def attempt(self, scope: Any, body: RecordedBody, send: Any) -> Attempt:
        """One pass through the proxy. Returning without an answer (what the proxy does when
        the replica died before answering) or raising counts as the proxy's own 500."""
        attempt = Attempt(send)
        try:
            await self.app(scope, body.replay(), attempt.send)
        except Exception:
            log.exception("the Ray Serve proxy failed on %s", scope.get("path"))
        if not attempt.started and attempt.held is None:
            attempt.held = {"status": 500, "headers": []}
        return attempt


class RecordedBody:
    """The request's `receive`, recording body messages so that a retry can replay them."""

    def __init__(self, receive: Any):
        self.receive = receive
        self.messages: list[dict] = []
        self.complete = False
        self.disconnected = False

    def replay(self) -> Any:
        index = 0

        async def receive() -> dict:
            nonlocal index
            if index < len(self.messages):
                index += 1
                return self.messages[index - 1]
            message = await self.receive()
            if message["type"] == "http.request":
                self.messages.append(message)
                index += 1
            elif message["type"] == "http.disconnect":
                self.disconnected = True
            return message

        return receive


class Attempt:
    """One pass of the request through the proxy: forwards the response, holds back the
    proxy's own error answers, and knows whether the response was cut."""

    def __init__(self, send: Any):
        self._send = send
        self.held: dict | None = None  # the proxy's own 5xx start message, not forwarded
        self.started = False
        self.finished = False
        self.sse = False

    async def send(self, message: dict) -> None:
        if self.held is not None:
            return  # the body of a held error answer
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or [])
            own = REPLICA_HEADER not in headers and b"json" not in headers.get(b"content-type", b"")
            if message["status"] >= 500 and own:
                self.held = message
                return
            self.started = True
            self.sse = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)

    async def finish(self, disconnected: bool) -> None:
        """Answer in OpenAI's shape what the proxy answered or cut (nothing for a gone client)."""
        if disconnected:
            return
        if self.held is not None:
            status = 503 if self.held["status"] == 500 else self.held["status"]
            extra = [(k, v) for k, v in self.held.get("headers") or [] if k.lower() == b"retry-after"]
            message = REPLICA_LOST if self.held["status"] == 500 else "the server is overloaded or has no replica ready"
            payload = json.dumps(error_body(message, "server_error")).encode()
            await self._send({"type": "http.response.start", "status": status,
                              "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(payload)).encode()), *extra]})
            await self._send({"type": "http.response.body", "body": payload})
        elif self.started and self.sse and not self.finished:
            event = protocol.sse(error_body(REPLICA_LOST, "server_error")) + protocol.DONE
            try:
                await self._send({"type": "http.response.body", "body": event.encode()})
            except Exception:  # the connection is already gone
                pass
