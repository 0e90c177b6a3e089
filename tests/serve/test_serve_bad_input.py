"""The bad-input matrix: each bad request is a 400 with an OpenAI error body naming the
field, and the server keeps serving others."""

import json

import httpx
import openai
import pytest
from tests_serve_util import MAX_MODEL_LEN, MODEL_NAME

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return json.dumps({"model": MODEL_NAME, "messages": USER, "max_tokens": 4, **fields})


def completion(**fields):
    return json.dumps({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4, **fields})


TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


CASES = [
    ("invalid JSON", COMPLETIONS, '{"prompt": "hi",', "body"),
    ("JSON that is not an object", CHAT, "[1, 2]", "body"),
    ("missing messages", CHAT, json.dumps({"model": MODEL_NAME}), "messages"),
    ("empty messages", CHAT, chat(messages=[]), "messages"),
    ("bad role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), "messages.0.role"),
    ("missing prompt", COMPLETIONS, json.dumps({"model": MODEL_NAME}), "prompt"),
    ("empty prompt", COMPLETIONS, completion(prompt=""), "prompt"),
    ("negative temperature", CHAT, chat(temperature=-0.5), "temperature"),
    ("NaN temperature", COMPLETIONS, completion().replace('"max_tokens"', '"temperature": NaN, "max_tokens"'),
     "temperature"),
    ("infinite temperature", CHAT, chat().replace('"max_tokens"', '"temperature": Infinity, "max_tokens"'),
     "temperature"),
    ("top_p negative", COMPLETIONS, completion(top_p=-0.1), "top_p"),
    ("top_p above one", CHAT, chat(top_p=1.5), "top_p"),
    ("max_tokens zero", COMPLETIONS, completion(max_tokens=0), "max_tokens"),
    ("max_tokens as a string", COMPLETIONS, completion(max_tokens="10"), "max_tokens"),
    ("temperature as a string", CHAT, chat(temperature="0.7"), "temperature"),
    ("a stop token id as a string", CHAT, chat(stop_token_ids=[2, "3"]), "stop_token_ids"),
    ("max_tokens negative", CHAT, chat(max_tokens=-3), "max_tokens"),
    ("max_tokens beyond context", CHAT, chat(max_tokens=MAX_MODEL_LEN + 1), "max_tokens"),
    ("max_tokens past the prompt's room", COMPLETIONS, completion(prompt="z" * 200, max_tokens=100), "max_tokens"),
    ("the default max_tokens past the prompt's room", COMPLETIONS,
     json.dumps({"model": MODEL_NAME, "prompt": [5] * (MAX_MODEL_LEN - 6)}), "max_tokens"),
    ("max_completion_tokens beyond context", CHAT, chat(max_completion_tokens=10_000), "max_completion_tokens"),
    ("prompt longer than context", COMPLETIONS, completion(prompt="word " * MAX_MODEL_LEN), "prompt"),
    ("messages longer than context", CHAT, chat(messages=[{"role": "user", "content": "w" * MAX_MODEL_LEN}]),
     "messages"),
    ("token ids out of vocabulary", COMPLETIONS, completion(prompt=[1, 2, 10_000_000]), "prompt"),
    ("unknown decoding", CHAT, chat(decoding="telepathy"), "decoding"),
    ("zero window", COMPLETIONS, completion(wedlm_window_size=0), "wedlm_window_size"),
    ("negative tau", CHAT, chat(wedlm_entropy_threshold=-1), "wedlm_entropy_threshold"),
    ("negative lambda", COMPLETIONS, completion(wedlm_pos_penalty_factor=-0.1), "wedlm_pos_penalty_factor"),
    ("numeric stop_by_ar", CHAT, chat(wedlm_stop_by_ar=1), "wedlm_stop_by_ar"),
    ("string stop_in_run", COMPLETIONS, completion(wedlm_stop_in_run="yes"), "wedlm_stop_in_run"),
    ("string temperature", CHAT, chat(temperature="hot"), "temperature"),
    ("n too large", COMPLETIONS, completion(n=1000), "n"),
    ("boolean temperature", COMPLETIONS, completion(temperature=True), "temperature"),
    ("boolean max_tokens", COMPLETIONS, completion(max_tokens=True), "max_tokens"),
    ("boolean max_completion_tokens", CHAT, chat(max_completion_tokens=True), "max_completion_tokens"),
    ("boolean n", CHAT, chat(n=True), "n"),
    # a flag is a JSON boolean, as wedlm_stop_by_ar: lax mode would read "no" as false and 1 as true
    ("string stream", CHAT, chat(stream="true"), "stream"),
    ("numeric stream", COMPLETIONS, completion(stream=1), "stream"),
    ("string ignore_eos", CHAT, chat(ignore_eos="no"), "ignore_eos"),
    ("numeric echo", COMPLETIONS, completion(echo=1), "echo"),
    ("string wedlm_trace", COMPLETIONS, completion(wedlm_trace="on"), "wedlm_trace"),
    ("string chat logprobs", CHAT, chat(logprobs="true"), "logprobs"),
    ("numeric add_generation_prompt", CHAT, chat(add_generation_prompt=0), "add_generation_prompt"),
    ("string include_usage", CHAT, chat(stream=True, stream_options={"include_usage": "yes"}),
     "stream_options.include_usage"),
    ("boolean stop token id", COMPLETIONS, completion(stop_token_ids=[True]), "stop_token_ids"),
    ("too many stop strings", CHAT, chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("logprobs above 20", COMPLETIONS, completion(logprobs=21), "logprobs"),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), "top_logprobs"),
    ("best_of above n", COMPLETIONS, completion(best_of=3), "best_of"),
    ("boolean best_of", COMPLETIONS, completion(best_of=True), "best_of"),
    ("stream_options without stream", CHAT, chat(stream_options={"include_usage": True}), "stream_options"),
    # no tool-call parser: a request that expects calls, or sends them, is refused rather than answered as text
    ("tools with OpenAI's default tool_choice", CHAT, chat(tools=[TOOL]), "tool_choice"),
    ("tool_choice required", CHAT, chat(tools=[TOOL], tool_choice="required"), "tool_choice"),
    ("a named tool", CHAT, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "add"}}),
     "tool_choice"),
    ("an assistant's tool calls", CHAT, chat(messages=USER + [{"role": "assistant", "content": None,
                                                              "tool_calls": [CALL]}]), "messages.1.tool_calls"),
    # values no field may hold, refused before validation wherever they are
    ("lone surrogate in a message", CHAT, chat(messages=[{"role": "user", "content": "a\ud800b"}]),
     "messages.0.content"),
    ("lone surrogate in a text part", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "\udfff"}]}]), "messages.0.content.0.text"),
    ("lone surrogate in the prompt", COMPLETIONS, completion(prompt="a\ud800b"), "prompt"),
    ("lone surrogate in a batch prompt", COMPLETIONS, completion(prompt=["ok", "\ud83d"]), "prompt.1"),
    ("lone surrogate in the model", CHAT, chat(model="a\ud800b"), "model"),
    ("lone surrogate in a stop string", COMPLETIONS, completion(stop=["\ud800"]), "stop.0"),
    ("lone surrogate in an unknown key", CHAT, chat(**{"x\ud800": 1}), "x\\ud800"),
    ("invalid UTF-8 in the body", COMPLETIONS, completion(prompt="caf").replace('"caf"', '"caf\udcff"').encode(
        "utf-8", "surrogateescape"), "body"),
    ("temperature past float32", CHAT, chat(temperature=3.5e38), "temperature"),
    ("temperature 1e308", COMPLETIONS, completion(temperature=1e308), "temperature"),
    ("streamed temperature 1e308", CHAT, chat(temperature=1e308, stream=True), "temperature"),
    ("negative overflowing lambda", COMPLETIONS, completion(wedlm_pos_penalty_factor=-1e300),
     "wedlm_pos_penalty_factor"),
    ("NaN in an unknown field", CHAT, chat().replace('"max_tokens"', '"extra": [1, NaN], "max_tokens"'), "extra.1"),
    ("nested 100,000 deep", COMPLETIONS, completion().replace('"max_tokens"', '"x": ' + "[" * 100_000 + "]" * 100_000
                                                             + ', "max_tokens"'), "body"),
    ("nested 40 deep", CHAT, chat(x=json.loads("[" * 40 + "]" * 40)), "x" + ".0" * 32),
]


@pytest.mark.parametrize("name,path,body,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_400_naming_the_field(base_url, name, path, body, param):
    r = httpx.post(base_url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["param"] == param
    assert param.split(".")[0] in error["message"] or param == "body"


@pytest.mark.parametrize("path, body", [(CHAT, chat(model="gpt-17")), (COMPLETIONS, completion(model="gpt-17"))])
def test_an_unknown_model_is_a_404_model_not_found(base_url, path, body):
    """As OpenAI's API and vLLM answer it, and as `GET /v1/models/{id}` does."""
    r = httpx.post(base_url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 404
    assert r.json()["error"] == {"message": f"The model 'gpt-17' does not exist; this server serves '{MODEL_NAME}'",
                                 "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


def test_tools_with_tool_choice_none_are_answered_without_them(base_url):
    r = httpx.post(base_url + CHAT, content=chat(tools=[TOOL], tool_choice="none", temperature=0),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 4


def test_server_keeps_serving_and_the_client_sees_typed_errors(base_url):
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=USER, temperature=-1)
    assert caught.value.param == "temperature" and caught.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=4, extra_body={"decoding": "nope"})
    assert caught.value.param == "decoding"
    ok = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=3, temperature=0)
    assert ok.usage.completion_tokens == 3
    assert httpx.get(f"{base_url}/metrics").text.count('status="400"') >= 1


def test_unknown_route_and_method_use_the_error_shape(base_url):
    missing = httpx.get(f"{base_url}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    wrong = httpx.get(f"{base_url}/v1/completions")
    assert wrong.status_code == 405 and "error" in wrong.json()


def test_null_means_the_default_as_in_openais_api(base_url):
    """A null field is a field not given: `n`, `stream`, `echo`, `ignore_eos`, `wedlm_trace` and
    `add_generation_prompt` take their defaults (the same answer as without them); a required field
    that is null is still a 400 naming it."""
    nulls = {"n": None, "stream": None, "ignore_eos": None, "wedlm_trace": None, "temperature": 0}
    for path, body, plain in [(CHAT, chat(add_generation_prompt=None, **nulls), chat(temperature=0)),
                              (COMPLETIONS, completion(echo=None, **nulls), completion(temperature=0))]:
        got, want = (httpx.post(base_url + path, content=b, headers={"Content-Type": "application/json"}, timeout=60)
                     for b in (body, plain))
        assert got.status_code == want.status_code == 200, got.text
        assert len(got.json()["choices"]) == 1
        key = "message" if path == CHAT else "text"
        assert got.json()["choices"][0][key] == want.json()["choices"][0][key]
    missing = httpx.post(base_url + CHAT, content=chat(messages=None), headers={"Content-Type": "application/json"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
