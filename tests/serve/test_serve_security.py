"""Access control: the API key (401 in OpenAI's shape, constant-time compare, public paths),
the Host check of a loopback bind (DNS rebinding: 421), JSON-only POST bodies (415), the
CORS allow-list, and the web chat sending its stored key."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from serve_fake_engine import FakeLLM, FakeParams
from tests_serve_util import running_server

from wedlm.serve import create_app
from wedlm.serve.security import AccessPolicy
from wedlm.testing import byte_tokenizer

KEY = "s3cret-key"
STATIC = Path(__file__).resolve().parents[2] / "wedlm" / "serve" / "static"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 3}


def serve(access: AccessPolicy):
    return running_server(create_app(FakeLLM(byte_tokenizer(256)), "fake", sampling_params_cls=FakeParams,
                                     access=access))


@pytest.fixture(scope="module")
def keyed():
    with serve(AccessPolicy(api_key=KEY)) as url:
        yield url


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("headers", [{}, bearer("wrong"), bearer(KEY + "x"), {"Authorization": KEY},
                                     {"Authorization": "Basic czNjcmV0LWtleQ=="}])
def test_a_missing_or_wrong_key_is_a_401_in_openai_shape(keyed, headers):
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/v1/nothing")):
        r = httpx.request(method, keyed + path, json=CHAT, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json() == {"error": {"message": "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                      "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def test_a_non_ascii_authorization_header_is_a_401(keyed):
    r = httpx.get(keyed + "/v1/models", headers=[(b"Authorization", b"Bearer \xff\xfe\x80")])
    assert r.status_code == 401


def test_the_key_opens_the_api_and_public_paths_stay_open(keyed):
    ok = httpx.post(keyed + "/v1/chat/completions", json=CHAT, headers=bearer(KEY))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(keyed + "/v1/models", headers=bearer(KEY)).json()["data"][0]["id"] == "fake"
    for path in ("/health", "/metrics", "/", "/static/app.js"):
        assert httpx.get(keyed + path).status_code == 200, path


def test_the_openai_client_with_the_key(keyed):
    good = openai.OpenAI(base_url=f"{keyed}/v1", api_key=KEY, max_retries=0)
    assert good.chat.completions.create(**CHAT).usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=f"{keyed}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.models.list()
    assert caught.value.code == "invalid_api_key"


def test_public_paths_are_configurable():
    with serve(AccessPolicy(api_key=KEY, public_paths=("/v1/models",))) as url:
        assert httpx.get(url + "/health").status_code == 401
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/v1/models").status_code == 200


@pytest.mark.parametrize("host, status", [
    ("127.0.0.1:8000", 200), ("localhost", 200), ("LOCALHOST:1", 200), ("[::1]:8000", 200), ("127.0.0.2", 200),
    ("evil.example", 421), ("evil.example:8000", 421), ("127.0.0.1.evil.example", 421), ("", 421),
    ("[::1", 421), ("\u00e9vil", 421),
])
def test_a_loopback_bind_serves_only_loopback_hosts(host, status):
    policy = AccessPolicy.for_bind("127.0.0.1")
    with serve(policy) as url:
        r = httpx.get(url + "/health", headers=[(b"Host", host.encode("utf-8"))])
    assert r.status_code == status, (host, r.text)
    if status == 421:
        assert r.json()["error"]["param"] == "Host" and "--allowed-hosts" in r.json()["error"]["message"]


def test_allowed_hosts_and_other_binds():
    with serve(AccessPolicy.for_bind("127.0.0.1", allowed_hosts=("box.lan",))) as url:
        assert httpx.get(url + "/health", headers={"Host": "box.lan:8000"}).status_code == 200
        assert httpx.get(url + "/health", headers={"Host": "other.lan"}).status_code == 421
    with serve(AccessPolicy.for_bind("0.0.0.0")) as url:  # an explicit network bind: any Host
        assert httpx.get(url + "/health", headers={"Host": "box.lan"}).status_code == 200
    with serve(AccessPolicy.for_bind("::1", allowed_hosts=("*",))) as url:
        assert httpx.get(url + "/health", headers={"Host": "anything"}).status_code == 200


@pytest.mark.parametrize("content_type, status", [
    ("application/json", 200), ("application/json; charset=utf-8", 200), ("Application/JSON", 200),
    ("text/plain", 415), ("text/plain;charset=UTF-8", 415), ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415), (None, 415),
])
def test_post_routes_need_a_json_content_type(keyed, content_type, status):
    headers = bearer(KEY) | ({"Content-Type": content_type} if content_type else {})
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = CHAT if path.endswith("chat/completions") else {"model": "fake", "prompt": "abc", "max_tokens": 2}
        r = httpx.post(keyed + path, content=json.dumps(body), headers=headers)
        assert r.status_code == status, (content_type, r.text)
        if status == 415:
            assert r.json()["error"]["param"] == "Content-Type"


def test_cors_allow_list():
    origin = "https://app.example"
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with serve(AccessPolicy(api_key=KEY, cors_origins=(origin,))) as url:
        ok = httpx.options(url + "/v1/chat/completions", headers=preflight)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == origin
        refused = httpx.options(url + "/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"Origin": origin, **bearer(KEY)})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    with serve(AccessPolicy()) as url:  # no allow-list: no CORS headers, so browsers keep the answer from pages
        r = httpx.options(url + "/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"Origin": origin})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("kwargs, message", [
    ({"api_key": ""}, "api_key must be a non-empty string"),
    ({"api_key": "   "}, "api_key must be a non-empty string"),
    ({"public_paths": ("health",)}, "public_paths entries must start with '/', got 'health'"),
    ({"allowed_hosts": ("a b",)}, "allowed_hosts entries must be non-empty names without spaces, got 'a b'"),
    ({"cors_origins": ("",)}, "cors_origins entries must be non-empty names without spaces, got ''"),
    ({"allowed_hosts": ()}, "allowed_hosts must name at least one host ('*' for any); an empty list would "
                            "refuse every request"),
])
def test_the_policy_is_checked_once(kwargs, message):
    with pytest.raises(ValueError) as err:
        AccessPolicy(**kwargs)
    assert str(err.value) == message


def test_the_web_chat_sends_the_stored_key():
    script = (STATIC / "app.js").read_text()
    assert 'headers["Authorization"] = `Bearer ${key}`' in script
    assert script.count("apiHeaders(") == 3  # its definition, /v1/models and /v1/chat/completions
    assert 'fetch("/v1/models", { headers: apiHeaders(false) })' in script
    assert "headers: apiHeaders(true)," in script
    assert 'id="api-key"' in (STATIC / "index.html").read_text()
