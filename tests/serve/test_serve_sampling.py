"""Sampling controls and logprobs through the server on the shipped model: range checks are 400s
naming the field, logit_bias and penalties act, logprobs come in OpenAI's chat and legacy
completions shapes, equal the library's, and streamed chunks carry their own tokens' logprobs."""

import json
from pathlib import Path

import httpx
import pytest
from tests_serve_util import running_server

from wedlm import LLM, SamplingParams

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
NAME = "wedlm-tiny"
COUNT = [{"role": "user", "content": "Count from 1 to 12."}]
pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped model is missing")


@pytest.fixture(scope="module")
def url():
    from wedlm.serve import create_app

    app = create_app(LLM(str(SHIPPED), device="cpu", wedlm_window_size=8, max_model_len=512), NAME)
    with running_server(app) as base:
        yield base


@pytest.fixture(scope="module")
def library():
    return LLM(str(SHIPPED), device="cpu", wedlm_window_size=8, max_model_len=512)


def post(url, path, **body):
    return httpx.post(url + path, json={"model": NAME, **body}, timeout=120)


def chat(url, **body):
    body = {"messages": COUNT, "max_tokens": 40, "temperature": 0, **body}
    return post(url, "/v1/chat/completions", **body)


def events(url, path, **body):
    """The JSON payloads of a streamed response."""
    with httpx.stream("POST", url + path, json={"model": NAME, "stream": True, **body}, timeout=120) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


BAD = [
    ("presence_penalty", 50), ("frequency_penalty", -2.5), ("repetition_penalty", 0), ("repetition_penalty", -1),
    ("min_p", 1.5), ("min_tokens", -1), ("min_tokens", 41), ("logit_bias", {"abc": 5}),
    ("logit_bias", {"20": 101}), ("logit_bias", {"20": "x"}), ("logit_bias", [20]), ("logit_bias", {"4096": 1}),
    ("top_logprobs", 21), ("top_logprobs", -1), ("presence_penalty", True), ("stop_token_ids", [-1]),
]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_out_of_range_is_a_400_naming_the_field(url, field, value):
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    r = chat(url, **{field: value}, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert field in r.json()["error"]["message"]


def test_completions_logprobs_range(url):
    r = post(url, "/v1/completions", prompt="1, 2,", max_tokens=4, logprobs=21)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    assert "[0, 20]" in r.json()["error"]["message"]


@pytest.mark.parametrize("decoding", ("ar", "wedlm", "blockwise", "verified"))
def test_logit_bias_bans_a_token_through_the_server(url, decoding):
    plain = chat(url, decoding=decoding).json()["choices"][0]["message"]["content"]
    assert plain == "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"
    banned = chat(url, decoding=decoding, logit_bias={"21": -100}).json()["choices"][0]["message"]["content"]
    assert "2" not in banned and banned.startswith("1, ")


def test_penalties_and_min_tokens_act_and_verified_equals_ar(url):
    controls = {"frequency_penalty": 2.0, "repetition_penalty": 1.2, "presence_penalty": 0.3}
    ar = chat(url, decoding="ar", **controls).json()
    assert ar["choices"][0]["message"]["content"] != "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"
    assert chat(url, decoding="verified", **controls).json()["choices"][0] == ar["choices"][0]
    long = chat(url, decoding="wedlm", min_tokens=39).json()
    assert long["usage"]["completion_tokens"] >= 39


def test_chat_logprobs_shape_and_values_equal_the_library(url, library):
    body = chat(url, decoding="ar", logprobs=True, top_logprobs=3).json()
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] - 1  # the final <|im_end|> has no text
    ids = library.tokenizer.apply_chat_template(COUNT, add_generation_prompt=True, tokenize=True, return_dict=False)
    ref = library.generate([ids], SamplingParams(temperature=0, max_tokens=40, decoding="ar", logprobs=3))[0]
    for entry, lp in zip(content, ref["logprobs"]):
        assert entry["logprob"] == pytest.approx(lp.logprob, abs=1e-4)
        assert bytes(entry["bytes"]).decode() == entry["token"]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx([v for _, v in lp.top], abs=1e-4)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the choice is the most likely
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True) and len(values) == 3


@pytest.mark.parametrize("decoding", ("ar", "wedlm"))
def test_chat_stream_logprobs_equal_non_stream(url, decoding):
    full = chat(url, decoding=decoding, logprobs=True, top_logprobs=2).json()["choices"][0]
    chunks = events(url, "/v1/chat/completions", messages=COUNT, max_tokens=40, temperature=0,
                    decoding=decoding, logprobs=True, top_logprobs=2)
    streamed, text = [], ""
    for c in chunks:
        choice = c["choices"][0]
        piece = choice["delta"].get("content") or ""
        entries = (choice["logprobs"] or {}).get("content", [])
        assert "".join(e["token"] for e in entries) == piece  # each chunk carries its own tokens
        streamed += entries
        text += piece
    assert text == full["message"]["content"]
    assert streamed == full["logprobs"]["content"]
    source = "ar_head" if decoding == "ar" else "mask_slot"
    assert full["logprobs"]["distribution"] == source
    assert {c["choices"][0]["logprobs"]["distribution"] for c in chunks if c["choices"][0]["logprobs"]} == {source}


def strict_json(text: str):
    """`text` parsed as strict JSON: NaN and Infinity (which Python's json module accepts) raise."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_an_echoed_mask_token_has_a_finite_logprob(url, library):
    """[MASK] (id 3) is banned from every output row, so its logprob is -inf; in a response it
    reads `LOGPROB_FLOOR` (JSON has no -inf), plain and streamed."""
    from wedlm.serve.logprobs import LOGPROB_FLOOR

    mask = library.engine.mask_token_id
    prompt = [5, mask, 7]
    r = httpx.post(url + "/v1/completions", timeout=120, json={"model": NAME, "prompt": prompt, "max_tokens": 1,
                                                                "temperature": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200
    lp = strict_json(r.text)["choices"][0]["logprobs"]
    ref = library.generate([prompt], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))[0]
    assert ref["prompt_logprobs"][1].logprob == float("-inf")
    assert lp["token_logprobs"][:3] == [None, LOGPROB_FLOOR, pytest.approx(ref["prompt_logprobs"][2].logprob, abs=1e-4)]
    with httpx.stream("POST", url + "/v1/completions", timeout=120,
                      json={"model": NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True,
                            "logprobs": 1, "stream": True}) as s:
        chunks = [strict_json(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    streamed = [v for c in chunks if c["choices"][0]["logprobs"] for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed[:3] == lp["token_logprobs"][:3]


def test_completions_legacy_logprobs_with_echo(url, library):
    prompt = "Tom, Anna,"  # the shipped model ends this raw prompt within 6 tokens
    body = post(url, "/v1/completions", prompt=prompt, max_tokens=6, temperature=0, decoding="ar",
                logprobs=2, echo=True).json()
    choice = body["choices"][0]
    lp = choice["logprobs"]
    n_prompt = body["usage"]["prompt_tokens"]
    assert choice["finish_reason"] == "stop"  # on a stop token, which has no text and no entry
    assert len(lp["tokens"]) == n_prompt + body["usage"]["completion_tokens"] - 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == choice["text"] and choice["text"].startswith(prompt)
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    ids = library.tokenizer.encode(prompt, add_special_tokens=False)
    ref = library.generate([ids], SamplingParams(temperature=0, max_tokens=6, decoding="ar", logprobs=2,
                                                 prompt_logprobs=2))[0]
    expected = [None] + [e.logprob for e in ref["prompt_logprobs"][1:]] + [e.logprob for e in ref["logprobs"][:-1]]
    assert lp["token_logprobs"] == pytest.approx(expected, abs=1e-4)
    for top, value in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]):
        assert len(top) <= 2 and max(top.values()) >= value - 1e-6
    stream = events(url, "/v1/completions", prompt=prompt, max_tokens=6, temperature=0, decoding="ar",
                    logprobs=2, echo=True)
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    for c in stream:
        part = c["choices"][0]
        text += part["text"]
        if part["logprobs"]:
            assert "".join(part["logprobs"]["tokens"]) == part["text"]
            for key in merged:
                merged[key] += part["logprobs"][key]
    assert text == choice["text"] and merged == {key: lp[key] for key in merged}
    assert lp["distribution"] == "ar_head"


def test_fields_of_the_other_endpoint_are_ignored(url):
    """Unknown fields are ignored: `echo` (a completions field) leaves a chat answer as it is,
    streamed or not, and a `messages` key does not turn a completions body's logprobs into chat's."""
    plain = chat(url).json()["choices"][0]["message"]["content"]
    assert plain.startswith("1, 2, 3")
    assert chat(url, echo=True).json()["choices"][0]["message"]["content"] == plain
    chunks = events(url, "/v1/chat/completions", messages=COUNT, max_tokens=40, temperature=0, echo=True)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == plain
    body = {"prompt": "Tom, Anna,", "max_tokens": 6, "temperature": 0, "decoding": "ar", "logprobs": 0}
    want = post(url, "/v1/completions", **body).json()["choices"][0]["logprobs"]
    assert want is not None and want["tokens"]
    assert post(url, "/v1/completions", **body, messages=COUNT).json()["choices"][0]["logprobs"] == want
