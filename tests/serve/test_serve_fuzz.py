"""No request body gets a 5xx: thousands of malformed bodies (hypothesis, derandomized so
CI runs the same examples) against every route of a real server over the shipped model.

Bodies start from a valid chat or completion request and get one to three mutations:
a known field (the sampling controls other branches add included) or an unknown one set
to a hostile value (wrong types, 1e308, -0.0, float32's edge, NaN/Infinity written as
JSON literals, integers past 2**64, lone surrogates, control-token text, huge arrays,
deep nesting), a message or prompt element replaced, a required field dropped, then
serialized with or without ASCII escapes and sometimes corrupted with invalid UTF-8
bytes. Every answer is a 2xx or a 4xx whose OpenAI error body names the parameter; at
the end the server is healthy and holds no request, no KV block and no queued sequence.
The default run sends about 1,300 bodies (15-60 s on 2 shared cores); the slow-marked run 8,800.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests_serve_util import make_llm, running_server, wait_until

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
NAME = "wedlm-tiny"
MAX_TOKENS = 3  # a valid mutated body is served: keep its generation short

FIELDS = [  # every request field of both routes, and the sampling controls of other branches
    "model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
    "stop_token_ids", "seed", "user", "decoding", "wedlm_window_size", "wedlm_entropy_threshold",
    "wedlm_pos_penalty_factor", "wedlm_stop_by_ar", "wedlm_stop_in_run", "ignore_eos", "wedlm_trace",
    "prompt", "echo", "logprobs", "suffix", "messages", "max_completion_tokens", "add_generation_prompt",
    "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty", "top_logprobs", "min_p",
    "min_tokens", "best_of", "response_format", "tools", "an_unknown_field", "a\ud800key",
]

EDGE_SCALARS = [
    None, True, False, 0, 1, -1, 2, 16, 17, 255, 256, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 10**300,
    0.0, -0.0, 0.5, 1.5, -1.5, 5e-324, 1e-320, 1.17e-38, 3.4028234663852886e38, 3.5e38, 1e308, -1e308,
    float("nan"), float("inf"), float("-inf"),
    "", "x", "wedlm", "ar", "user", "null", "NaN", "1e308", "a\ud800b", "\udfff", "\ud83d", "\x00\x01\x1f",
    "<|im_end|>\n<|im_start|>system\n", "<|endoftext|>", "\ue0000\ue001", "é" * 300, "9" * 5000,
]


def nested(depth: int, leaf) -> list:
    out = leaf
    for _ in range(depth):
        out = [out]
    return out


DEEP = "__deep__"  # written as 5,000 nested arrays after serializing (json.dumps cannot)
DEEP_JSON = b"[" * 5_000 + b"0" + b"]" * 5_000
HUGE = [[0] * 100_000, ["a"] * 3_000, [[1, 2]] * 3_000, nested(40, 1), DEEP,
        {"k" * 10_000: 1}, {str(i): i for i in range(2_000)}]

scalars = st.one_of(st.sampled_from(EDGE_SCALARS), st.integers(), st.text(max_size=12),
                    st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8) | st.sampled_from(HUGE)


def base(chat: bool) -> dict:
    if chat:
        return {"model": NAME, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": MAX_TOKENS}
    return {"model": NAME, "prompt": "Count from 1 to 5.", "max_tokens": MAX_TOKENS}


@st.composite
def mutated(draw, chat: bool) -> dict:
    body = base(chat)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["field", "field", "field", "inner", "drop"]))
        if op == "field":
            body[draw(st.sampled_from(FIELDS))] = draw(values)
        elif op == "drop":
            body.pop(draw(st.sampled_from(sorted(body))), None)
        elif chat and isinstance(body.get("messages"), list) and body["messages"] and \
                isinstance(body["messages"][0], dict):
            body["messages"][0][draw(st.sampled_from(["role", "content", "name", "tool_calls"]))] = draw(values)
        else:
            body["prompt"] = [draw(values), draw(values)] if draw(st.booleans()) else draw(values)
    for field in ("max_tokens", "max_completion_tokens"):  # a served body stays short
        value = body.get(field)
        if (field == "max_tokens" and field not in body) or (type(value) is int and 0 < value < 2**31):
            body[field] = MAX_TOKENS
    return body


CORRUPTIONS = [b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80"]


@st.composite
def encoded(draw, chat: bool) -> bytes:
    body = draw(mutated(chat))
    ascii_only = draw(st.booleans())
    text = json.dumps(body, allow_nan=True, ensure_ascii=ascii_only)
    raw = text.encode("utf-8", "surrogatepass")  # an unescaped lone surrogate becomes invalid UTF-8
    raw = raw.replace(f'"{DEEP}"'.encode(), DEEP_JSON)
    if draw(st.integers(0, 9)) == 0:  # invalid UTF-8 inside a string value
        anchor = b"What" if chat else b"Count"
        raw = raw.replace(anchor, anchor[:2] + draw(st.sampled_from(CORRUPTIONS)) + anchor[2:], 1)
    if draw(st.integers(0, 19)) == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    return raw


@pytest.fixture(scope="module")
def shipped_server():
    from wedlm.serve import create_app

    app = create_app(make_llm(SHIPPED, max_num_seqs=32), NAME)
    with running_server(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client, app.state.server


def check_answer(r: httpx.Response, raw: bytes) -> None:
    """A 2xx, or a 4xx whose OpenAI error body names the parameter."""
    assert r.status_code < 500, (raw[:300], r.text[:500])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, r.text[:300]
        assert isinstance(error["param"], str) and error["param"], (raw[:300], r.text[:300])
        assert error["param"] == "body" or error["param"].split(".")[0] in error["message"], r.text[:300]
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text, r.text[-500:]
    else:
        assert r.json()["choices"], r.text[:300]


def post(client: httpx.Client, path: str, raw: bytes) -> httpx.Response:
    return client.post(path, content=raw, headers={"Content-Type": "application/json"})


def assert_idle(client: httpx.Client, server) -> None:
    """Healthy, and nothing held: no engine request, no KV block, no queued sequence."""
    assert client.get("/health").status_code == 200
    engine = server.engine
    assert wait_until(lambda: engine.num_active() == 0 and engine.snapshot.get("num_running") == 0
                      and engine.snapshot.get("kv_blocks_free") == engine.snapshot.get("kv_blocks_total"),
                      timeout=30), engine.snapshot
    assert server.admission.held == 0


def fuzz(client, server, examples: int) -> None:
    common = dict(max_examples=examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))

    @settings(**common)
    @given(st.booleans().flatmap(lambda chat: st.tuples(st.just(chat), encoded(chat))))
    def one(case):
        chat, raw = case
        check_answer(post(client, "/v1/chat/completions" if chat else "/v1/completions", raw), raw)

    @settings(**{**common, "max_examples": max(examples // 10, 20)})
    @given(st.binary(max_size=64), st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    def junk(raw, path):
        check_answer(post(client, path, raw), raw)

    one()
    junk()
    assert_idle(client, server)


def test_no_body_gets_a_5xx(shipped_server):
    client, server = shipped_server
    fuzz(client, server, examples=1_200)


@pytest.mark.slow
def test_no_body_gets_a_5xx_long_run(shipped_server):
    client, server = shipped_server
    fuzz(client, server, examples=8_000)


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/metrics", "/", "/static/app.js"])
def test_get_routes_ignore_bodies_and_queries(shipped_server, path):
    client, server = shipped_server
    for raw in [b"", b"\xff\xfe", b'{"a": NaN}', DEEP_JSON]:
        r = client.request("GET", path + "?model=%ED%A0%80&x=%FF&n=1e308", content=raw)
        assert r.status_code == 200, r.text[:200]
        assert client.post(path, content=raw, headers={"Content-Type": "application/json"}).status_code in (404, 405)
    assert_idle(client, server)


def test_health_answers_head_as_load_balancers_probe_it(shipped_server):
    client, server = shipped_server
    head, get = client.head("/health"), client.get("/health")
    assert head.status_code == get.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == get.headers["content-length"]
    assert_idle(client, server)
