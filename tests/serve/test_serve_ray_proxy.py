"""`ReplicaFailover` (the Ray Serve proxy middleware) on scripted proxy answers: a replica lost
before answering is retried once with the same body, twice lost is an OpenAI 503, a cut SSE
stream ends with an error event and [DONE], and replica-written answers pass untouched."""

import asyncio
import json

from wedlm.serve.ray_proxy import REPLICA_LOST, ReplicaFailover

BODY = b'{"prompt": "abc"}'
PLAIN_500 = [{"type": "http.response.start", "status": 500,
              "headers": [(b"content-type", b"text/plain; charset=utf-8")]},
             {"type": "http.response.body", "body": b"Internal Server Error"}]
REPLICA_OK = [{"type": "http.response.start", "status": 200,
               "headers": [(b"content-type", b"application/json"), (b"x-wedlm-replica", b"r2@h:2")]},
              {"type": "http.response.body", "body": b'{"ok": true}'}]


class ScriptedProxy:
    """An ASGI app that reads the whole body, then sends the next scripted answer."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.bodies = []

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        for message in self.answers.pop(0):
            await send(message)


def run(app):
    """Send one POST with BODY (in two chunks) through ReplicaFailover(app); the messages sent back."""
    chunks = [{"type": "http.request", "body": BODY[:5], "more_body": True},
              {"type": "http.request", "body": BODY[5:], "more_body": False}]
    sent = []

    async def receive():
        if chunks:
            return chunks.pop(0)
        await asyncio.sleep(3600)  # the client stays connected

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(ReplicaFailover(app)(scope, receive, send))
    return sent


def test_a_replica_lost_before_answering_is_retried_once_with_the_same_body():
    proxy = ScriptedProxy(PLAIN_500, REPLICA_OK)
    sent = run(proxy)
    assert proxy.bodies == [BODY, BODY]
    assert sent == REPLICA_OK


def test_no_answer_from_the_proxy_counts_as_a_lost_replica():
    proxy = ScriptedProxy([], REPLICA_OK)  # what Ray's proxy does when the replica died
    assert run(proxy) == REPLICA_OK and proxy.bodies == [BODY, BODY]


def test_lost_twice_is_an_openai_503():
    proxy = ScriptedProxy([], PLAIN_500)
    start, body = run(proxy)
    assert len(proxy.bodies) == 2 and start["status"] == 503
    assert (b"content-type", b"application/json") in start["headers"]
    assert json.loads(body["body"]) == {"error": {"message": REPLICA_LOST, "type": "server_error",
                                                  "param": None, "code": None}}


def test_proxy_overload_keeps_its_status_and_retry_after_in_openai_shape():
    busy = [{"type": "http.response.start", "status": 503,
             "headers": [(b"content-type", b"text/plain"), (b"retry-after", b"2")]},
            {"type": "http.response.body", "body": b"Service Unavailable"}]
    proxy = ScriptedProxy(busy)
    start, body = run(proxy)
    assert len(proxy.bodies) == 1  # not retried: no replica was lost
    assert start["status"] == 503 and (b"retry-after", b"2") in start["headers"]
    assert json.loads(body["body"])["error"]["type"] == "server_error"


def test_a_cut_stream_ends_with_an_error_event_and_done():
    cut = [{"type": "http.response.start", "status": 200,
            "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"x-wedlm-replica", b"r1@h:1")]},
           {"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True}]
    sent = run(ScriptedProxy(cut))
    assert sent[:2] == cut
    tail = sent[2]["body"].decode()
    error, done = tail.split("\n\n")[:2]
    assert json.loads(error[len("data: "):])["error"]["message"] == REPLICA_LOST
    assert done == "data: [DONE]" and not sent[2].get("more_body", False)


def test_answers_written_by_a_replica_pass_untouched():
    crash = [{"type": "http.response.start", "status": 500,
              "headers": [(b"content-type", b"application/json"), (b"x-wedlm-replica", b"r1@h:1")]},
             {"type": "http.response.body", "body": b'{"error": {"message": "boom"}}'}]
    for answer in (REPLICA_OK, crash):
        proxy = ScriptedProxy(answer)
        assert run(proxy) == answer and len(proxy.bodies) == 1
