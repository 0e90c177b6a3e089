"""Edge cases: stop strings spanning tokens, stop token first, max_tokens 1, context limit, seeds."""

import pytest

from wedlm import SamplingParams
from wedlm.engine.defaults import DECODERS
from wedlm.engine.errors import RequestError

PROMPT = [72, 101, 108, 108, 111]  # "Hello"


def greedy(decoding="ar", **kw):
    kw.setdefault("max_tokens", 16)
    return SamplingParams(temperature=0, decoding=decoding, ignore_eos=True, **kw)


@pytest.mark.parametrize("decoding", DECODERS)
def test_stop_token_as_first_token(llm, decoding):
    first = llm.generate([PROMPT], greedy(decoding))[0]["token_ids"][0]
    out = llm.generate([PROMPT], greedy(decoding, stop_token_ids=[first]))[0]
    assert out["token_ids"] == [first] and out["text"] == "" and out["finish_reason"] == "stop"


@pytest.mark.parametrize("decoding", DECODERS)
def test_max_tokens_one(llm, decoding):
    ref = llm.generate([PROMPT], greedy("ar"))[0]["token_ids"]
    out = llm.generate([PROMPT], greedy(decoding, max_tokens=1))[0]
    assert len(out["token_ids"]) == 1 and out["finish_reason"] == "length"
    if decoding in ("ar", "verified"):
        assert out["token_ids"] == ref[:1]


def _ascii_run(text, n):
    """Start of the first run of n printable ASCII characters after position 0."""
    for i in range(1, len(text) - n):
        if all(32 < ord(c) < 127 for c in text[i:i + n]):
            return i
    raise AssertionError(f"no ascii run in {text!r}")


@pytest.mark.parametrize("decoding", ["ar", "wedlm"])
def test_stop_string_spanning_tokens(llm, decoding):
    params = greedy(decoding, max_tokens=40)
    full = llm.generate([PROMPT], params)[0]
    i = _ascii_run(full["text"], 3)
    stop = full["text"][i:i + 3]
    first = full["text"].find(stop)
    out = llm.generate([PROMPT], greedy(decoding, max_tokens=40, stop=[stop]))[0]
    assert out["text"] == full["text"][:first] and out["finish_reason"] == "stop"
    assert full["token_ids"][:len(out["token_ids"])] == out["token_ids"]
    assert llm.tokenizer.decode(out["token_ids"]).startswith(out["text"] + stop)
    streamed = list(llm.generate_stream([PROMPT], greedy(decoding, max_tokens=40, stop=stop)))
    assert "".join(d["new_text"] for d in streamed) == out["text"]  # no part of the stop emitted
    assert streamed[-1]["finish_reason"] == "stop"


def test_prompt_at_the_context_limit(make_llm):
    """A request must fit as asked: prompt + max_tokens <= max_model_len (docs/engine.md); one that
    does not is refused naming max_tokens, never cut short."""
    llm = make_llm(max_model_len=24)
    for decoding in DECODERS:
        out = llm.generate([list(range(23))], greedy(decoding, max_tokens=1))[0]
        assert len(out["token_ids"]) == 1 and out["finish_reason"] == "length"
        out = llm.generate([list(range(20))], greedy(decoding, max_tokens=4))[0]
        assert len(out["token_ids"]) == 4 and out["finish_reason"] == "length"
        with pytest.raises(RequestError, match="max_tokens=5 does not fit: the prompt has 20 tokens and "
                                               "max_model_len=24 leaves 4") as info:
            llm.generate([list(range(20))], greedy(decoding, max_tokens=5))
        assert info.value.param == "max_tokens"
    with pytest.raises(ValueError, match="prompt has 24 tokens; max_model_len is 24"):
        llm.generate([list(range(24))], greedy())
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([""], greedy())
    assert not llm.has_unfinished()


@pytest.mark.parametrize("decoding", DECODERS)
def test_same_seed_same_output(llm, decoding):
    p = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=7, max_tokens=12, decoding=decoding,
                       ignore_eos=True)
    a = llm.generate([PROMPT], p)[0]["token_ids"]
    b = llm.generate([PROMPT, [1, 2, 3]], [p, p])[0]["token_ids"]
    other = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=8, max_tokens=12, decoding=decoding,
                           ignore_eos=True)
    c = llm.generate([PROMPT], other)[0]["token_ids"]
    assert a == b and len(a) == 12
    assert c != a


def test_model_stop_ids_apply_unless_ignore_eos(llm):
    eos = llm.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    out = llm.generate([PROMPT], SamplingParams(temperature=0, decoding="ar", max_tokens=300))[0]
    assert eos in llm.engine.stop_ids
    if out["finish_reason"] == "stop":
        assert out["token_ids"][-1] in llm.engine.stop_ids
    else:
        assert not set(out["token_ids"]) & set(llm.engine.stop_ids)


@pytest.mark.parametrize("decoding", DECODERS)
def test_tiny_temperature_and_any_integer_seed(llm, decoding):
    """A temperature near 0 samples the argmax (no inf/NaN probabilities); any int seed works."""
    ref = llm.generate([PROMPT], greedy("ar", max_tokens=8))[0]
    for temperature, seed in ((1e-300, 2 ** 70), (1e-30, -1)):
        params = SamplingParams(temperature=temperature, seed=seed, decoding=decoding, ignore_eos=True,
                                max_tokens=8)
        out = llm.generate([PROMPT], params)[0]
        assert out.get("error") is None and out["finish_reason"] == "length" and len(out["token_ids"]) == 8
        if decoding in ("ar", "verified"):
            assert out["token_ids"] == ref["token_ids"]
    assert llm.metrics()["kv_blocks_free"] == llm.metrics()["kv_blocks_total"]


@pytest.mark.parametrize("decoding", DECODERS)
def test_top_p_zero_decodes_like_greedy(llm, decoding):
    """top_p = 0 keeps only the most likely token (OpenAI's range is [0, 1]): the tokens are the
    greedy ones whatever the temperature and seed."""
    greedy_out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=10, decoding=decoding,
                                                       ignore_eos=True))[0]["token_ids"]
    for seed in (1, 2):
        nucleus = SamplingParams(temperature=1.5, top_p=0, seed=seed, max_tokens=10, decoding=decoding,
                                 ignore_eos=True)
        assert llm.generate([PROMPT], nucleus)[0]["token_ids"] == greedy_out
    assert len(greedy_out) == 10


def test_a_decoder_that_cannot_plan_fails_its_request_alone(llm, monkeypatch):
    """A window plan that raises (here: for requests of max_tokens 7) ends that request with its
    error; the request beside it decodes as it does alone, and every KV block comes back."""
    from wedlm.engine.decoders.streaming import StreamingDecoder

    plan = StreamingDecoder.plan

    def failing(self, seq):
        if seq.params.max_tokens == 7:
            raise OverflowError("cannot convert float infinity to integer")
        return plan(self, seq)

    alone = llm.generate([PROMPT], greedy("wedlm"))[0]
    monkeypatch.setattr(StreamingDecoder, "plan", failing)
    out = llm.generate([PROMPT, PROMPT], [greedy("wedlm", max_tokens=7), greedy("wedlm")])
    assert out[0]["finish_reason"] == "abort"
    assert out[0]["error"] == "decoder failed to plan its window: cannot convert float infinity to integer"
    assert out[1]["token_ids"] == alone["token_ids"] and len(alone["token_ids"]) == 16
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks
