"""Structured outputs through the server: response_format (json_object, json_schema) and vLLM's
structured_outputs / guided_* fields give valid answers equal to the library's; bad schemas and
regexes are 400s naming the field with nothing queued; a missing backend is a 400 too."""

import json
import re
import sys

import httpx
import pytest
from tests_serve_util import MODEL_NAME

from wedlm import SamplingParams

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ENUM_SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}, "b": {"type": "boolean"}},
               "required": ["a", "b"], "additionalProperties": False}


def post(base_url, path, **fields):
    body = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, **fields}
    if path == CHAT:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    else:
        body.setdefault("prompt", "hi")
    return httpx.post(base_url + path, json=body, timeout=120)


def text_of(response) -> str:
    choice = response.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("decoding", ["wedlm", "verified"])
def test_response_format_json_schema_matches_the_library(base_url, reference_llm, decoding):
    fmt = {"type": "json_schema", "json_schema": {"name": "pair", "schema": ENUM_SCHEMA, "strict": True}}
    r = post(base_url, COMPLETIONS, response_format=fmt, decoding=decoding)
    assert r.status_code == 200, r.text
    value = json.loads(text_of(r))
    assert value["a"] in ("x", "yy") and isinstance(value["b"], bool)
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    ref = reference_llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=24, decoding=decoding,
                                                        structured={"json_schema": ENUM_SCHEMA}))[0]
    assert text_of(r) == ref["text"]


def test_json_object_and_vllm_fields(base_url):
    r = post(base_url, CHAT, response_format={"type": "json_object"}, max_tokens=6)
    assert r.status_code == 200, r.text
    text, finish = text_of(r), r.json()["choices"][0]["finish_reason"]
    assert text.startswith("{") and (finish == "length" or isinstance(json.loads(text), dict))
    r = post(base_url, CHAT, guided_choice=["cat", "dog"], n=2, temperature=1.0, seed=3)
    assert [c["message"]["content"] in ("cat", "dog") for c in r.json()["choices"]] == [True, True]
    r = post(base_url, COMPLETIONS, structured_outputs={"regex": "[ab]{1,3}-[0-9]{2}"}, stream=True)
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in r.text.splitlines()
                   if line.startswith("data: {"))
    assert re.fullmatch("[ab]{1,3}-[0-9]{2}", text), text
    r = post(base_url, COMPLETIONS, guided_json=ENUM_SCHEMA, decoding="blockwise")
    assert json.loads(text_of(r))["a"] in ("x", "yy")
    r = post(base_url, COMPLETIONS, guided_regex="(yes|no)", decoding="ar")
    assert text_of(r) in ("yes", "no")
    r = post(base_url, COMPLETIONS, response_format={"type": "text"}, max_tokens=3)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"guided_regex": "("}, "guided_regex"),
    ({"guided_json": "{oops"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
    # the library's refusal names its own field, `structured`; the server names the one sent
    ({"guided_choice": ["yes"], "ignore_eos": True}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "response_format"),
])
def test_bad_constraints_are_400s_naming_the_field_and_queue_nothing(base_url, server, fields, param,
                                                                     monkeypatch):
    loop = server[1].state.server.engine
    submitted = []
    monkeypatch.setattr(loop, "submit", lambda *args, **kwargs: submitted.append(args))
    r = post(base_url, CHAT, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"], error
    assert submitted == []


def test_two_constraints_at_once_are_refused(base_url):
    r = post(base_url, CHAT, guided_regex="a+", response_format={"type": "json_object"})
    assert r.status_code == 400 and "at most one" in r.json()["error"]["message"]


def test_missing_backend_is_a_400(base_url, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    r = post(base_url, CHAT, guided_regex="a+")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "guided_regex" and "wedlm[structured]" in error["message"]


def test_a_constrained_answer_cut_by_max_tokens_finishes_with_length(base_url):
    fmt = {"type": "json_schema", "json_schema": {"name": "pair", "schema": ENUM_SCHEMA}}
    r = post(base_url, CHAT, response_format=fmt, max_tokens=3)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 3
    assert choice["message"]["content"] == '{"a'
