"""The official `openai` client against a real server on loopback: completions and chat,
streamed and not, equal to the library's `LLM.generate` for the same greedy request;
WeDLM knobs as extra body fields; usage with decode metrics; models, health, metrics."""

import httpx
import openai
import pytest
from tests_serve_util import MAX_MODEL_LEN, MODEL_NAME, metric_value

from wedlm import SamplingParams

FAST = {"wedlm_entropy_threshold": 6.0}  # fills most masks per step on random weights: few forwards
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def library(llm, prompt, **kwargs):
    """The library's greedy result for `prompt`."""
    return llm.generate([prompt], SamplingParams(temperature=0.0, **kwargs))[0]


def chat_text(llm, messages):
    return llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_completion_equals_library_generate(client, reference_llm):
    want = library(reference_llm, "The quick brown fox", max_tokens=8)
    got = client.completions.create(model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert got.choices[0].text == want["text"] and got.choices[0].finish_reason == want["finish_reason"]
    usage = got.usage
    assert usage.completion_tokens == len(want["token_ids"]) == 8
    assert usage.prompt_tokens == len(reference_llm.tokenizer.encode("The quick brown fox", add_special_tokens=False))
    extra = usage.model_extra
    assert extra["decode_forwards"] == want["stats"]["decode_forwards"]
    assert extra["tokens_per_forward"] == pytest.approx(want["stats"]["tokens_per_forward"], abs=1e-3)
    assert extra["p_cache"] == pytest.approx(want["stats"]["p_cache"], abs=1e-3)


@pytest.mark.parametrize("decoding", ["ar", "wedlm"])
def test_top_p_zero_answers_like_greedy(client, reference_llm, decoding):
    """OpenAI's top_p range is [0, 1]; 0 keeps only the most likely token, whatever the temperature."""
    want = library(reference_llm, "The quick brown fox", max_tokens=8, decoding=decoding, ignore_eos=True)
    got = client.completions.create(model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8, temperature=1.5,
                                    top_p=0, seed=3, extra_body={"decoding": decoding, "ignore_eos": True})
    assert got.choices[0].text == want["text"] and got.usage.completion_tokens == len(want["token_ids"]) == 8


def test_streamed_completion_equals_library_generate(client, reference_llm):
    want = library(reference_llm, "Once upon a time", max_tokens=16, **FAST)
    stream = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=16,
                                       temperature=0, stream=True, extra_body=FAST)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == want["text"]
    assert chunks[-1].choices[0].finish_reason == want["finish_reason"]
    assert all(c.object == "text_completion" for c in chunks)


def test_chat_equals_library_generate(client, reference_llm):
    want = library(reference_llm, chat_text(reference_llm, MESSAGES), max_tokens=16, **FAST)
    got = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0,
                                         extra_body=FAST)
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want["text"]
    assert got.usage.completion_tokens == len(want["token_ids"])


def test_streamed_chat_equals_library_generate_with_usage(client, reference_llm):
    want = library(reference_llm, chat_text(reference_llm, MESSAGES), max_tokens=16, **FAST)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=FAST)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want["text"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == len(want["token_ids"])
    assert usage.model_extra["decode_forwards"] == want["stats"]["decode_forwards"]
    assert usage.model_extra["tokens_per_forward"] > 1  # parallel commits on this setting


@pytest.mark.parametrize("knobs", [
    {"decoding": "ar"},
    {"decoding": "verified", "wedlm_window_size": 4},
    {"decoding": "wedlm", "wedlm_window_size": 8, "wedlm_entropy_threshold": 5.0, "wedlm_pos_penalty_factor": 0.1},
    {"decoding": "wedlm", "wedlm_window_size": 8, "wedlm_entropy_threshold": 5.0, "wedlm_stop_by_ar": True},
    {"decoding": "wedlm", "wedlm_window_size": 8, "wedlm_entropy_threshold": 5.0, "wedlm_stop_by_ar": True,
     "wedlm_stop_in_run": True},
])
def test_wedlm_knobs_as_extra_body_fields(client, reference_llm, knobs):
    want = library(reference_llm, "abc", max_tokens=6, **knobs)
    got = client.completions.create(model=MODEL_NAME, prompt="abc", max_tokens=6, temperature=0, extra_body=knobs)
    assert got.choices[0].text == want["text"]
    assert got.usage.model_extra["decode_forwards"] == want["stats"]["decode_forwards"]
    if knobs["decoding"] == "ar":
        assert got.usage.model_extra["tokens_per_forward"] == 1.0 and got.usage.model_extra["p_cache"] == 1.0


def test_models_health_and_metrics(client, base_url):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert models.data[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert models.data[0].model_extra["wedlm"] == {  # the web chat's controls start from these
        "decoders": ["wedlm", "ar", "blockwise", "verified"], "wedlm_window_size": 16,
        "wedlm_entropy_threshold": 0.4, "wedlm_pos_penalty_factor": 0.02, "wedlm_stop_by_ar": False,
        "wedlm_stop_in_run": False, "wedlm_single_turn": False, "wedlm_chat_only": False}
    health = httpx.get(f"{base_url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    text = httpx.get(f"{base_url}/metrics").text
    for name in ("wedlm_requests_total", "wedlm_generation_tokens_total", "wedlm_decode_forwards_total",
                 "wedlm_tokens_per_forward_bucket", "wedlm_p_cache_bucket", "wedlm_queue_length",
                 "wedlm_kv_blocks_in_use", "wedlm_prefix_cache_hit_tokens_total",
                 "wedlm_prefix_cache_hit_requests_total"):
        assert name in text, name
    assert metric_value(text, "wedlm_generation_tokens_total") >= 8
    assert metric_value(text, "wedlm_kv_blocks_in_use") == 0
    assert metric_value(text, "wedlm_tokens_per_forward_count") >= 1
