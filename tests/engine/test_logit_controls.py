"""Logit controls on the shipped model: logit_bias, penalties and min_tokens act on every decoder,
`verified` stays equal to `ar` under each, and `ar` under penalties equals a reference computed by
hand on the logits of a direct teacher-forced forward."""

from pathlib import Path

import pytest
import torch

from wedlm import SamplingParams
from wedlm.engine.errors import RequestError
from wedlm.model import DenseAttention, load_model

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
DECODERS = ("ar", "wedlm", "blockwise", "verified")
pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped model is missing")


@pytest.fixture(scope="module")
def llm(shipped_llm):
    return shipped_llm


@pytest.fixture(scope="module")
def prompt(llm):
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": "Count from 1 to 12."}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)


def run(llm, prompt, decoding, **kw):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 40, "decoding": decoding, **kw})
    return llm.generate([list(prompt)], params)[0]


def test_greedy_counts_to_twelve(llm, prompt):
    out = run(llm, prompt, "ar")
    assert out["text"] == "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"


@pytest.mark.parametrize("decoding", DECODERS)
def test_logit_bias_minus_100_bans_a_token_greedy_ar_emits(llm, prompt, decoding):
    banned = llm.tokenizer.convert_tokens_to_ids("2")
    assert banned in run(llm, prompt, "ar")["token_ids"]
    out = run(llm, prompt, decoding, logit_bias={banned: -100})
    assert banned not in out["token_ids"]
    assert out["token_ids"] != run(llm, prompt, decoding)["token_ids"]


@pytest.mark.parametrize("decoding", DECODERS)
def test_logit_bias_plus_100_forces_a_token(llm, prompt, decoding):
    forced = llm.tokenizer.convert_tokens_to_ids("7")
    out = run(llm, prompt, decoding, logit_bias={str(forced): 100}, max_tokens=6)  # string keys as in JSON
    assert out["token_ids"] == [forced] * 6


CONTROLS = [dict(frequency_penalty=2.0), dict(presence_penalty=-2.0, repetition_penalty=0.4),
            dict(repetition_penalty=1.8, frequency_penalty=0.7, presence_penalty=0.4),
            dict(min_tokens=39), dict(logit_bias={15: -4.5}, frequency_penalty=1.0)]


@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: ",".join(c))
def test_verified_equals_ar_under_controls(llm, prompt, controls):
    ar = run(llm, prompt, "ar", **controls)["token_ids"]
    assert ar != run(llm, prompt, "ar")["token_ids"]  # the control changes the output
    assert run(llm, prompt, "verified", **controls)["token_ids"] == ar


@pytest.mark.parametrize("decoding", ("wedlm", "blockwise"))
def test_penalties_change_the_parallel_decoders(llm, prompt, decoding):
    plain = run(llm, prompt, decoding)
    out = run(llm, prompt, decoding, frequency_penalty=2.0)
    assert out["token_ids"] != plain["token_ids"]
    assert out["token_ids"][:6] == plain["token_ids"][:6]  # "1, 2," repeats nothing yet


@pytest.mark.parametrize("decoding", DECODERS)
def test_min_tokens_delays_the_end(llm, prompt, decoding):
    plain = run(llm, prompt, decoding)
    assert plain["finish_reason"] == "stop" and len(plain["token_ids"]) < 39
    out = run(llm, prompt, decoding, min_tokens=39)
    assert len(out["token_ids"]) >= 39
    assert not set(out["token_ids"][:38]) & {0, 2}  # the model's stop ids (eos, <|im_end|>)


def reference_logits(model, ids):
    """AR next-token logits float [len(ids), V] of a direct causal forward, [MASK] excluded."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], DenseAttention())[0].float()
    logits[:, model.config.mask_token_id] = float("-inf")
    return logits


def by_hand(row, prompt, generated, c):
    """The controls applied to one logits row, token by token (the OpenAI / transformers formulas)."""
    row = row.clone()
    for t, b in (c.get("logit_bias") or {}).items():
        row[t] += b
    for t in set(prompt) | set(generated):
        r = c.get("repetition_penalty", 1.0)
        row[t] = row[t] / r if row[t] > 0 else row[t] * r
    for t in set(generated):
        row[t] -= c.get("frequency_penalty", 0.0) * generated.count(t) + c.get("presence_penalty", 0.0)
    return row


@pytest.mark.parametrize("controls", CONTROLS[:3] + CONTROLS[4:], ids=lambda c: ",".join(c))
def test_ar_under_penalties_equals_a_hand_reference(llm, prompt, controls):
    out = run(llm, prompt, "ar", logprobs=3, **controls)
    ids = list(prompt) + out["token_ids"]
    logits = reference_logits(load_model(str(SHIPPED), dtype="float32", device="cpu").eval(), ids[:-1])
    for i, (token, lp) in enumerate(zip(out["token_ids"], out["logprobs"])):
        row = by_hand(logits[len(prompt) - 1 + i], list(prompt), out["token_ids"][:i], controls)
        assert int(row.argmax()) == token
        ref = torch.log_softmax(row, -1)
        assert lp.logprob == pytest.approx(float(ref[token]), abs=1e-4)
        assert [t for t, _ in lp.top] == ref.topk(3).indices.tolist()


def test_min_p_keeps_only_likely_tokens(llm, prompt):
    params = dict(temperature=1.5, max_tokens=24, decoding="ar", logprobs=1)
    plain = [llm.generate([list(prompt)], SamplingParams(seed=s, **params))[0] for s in range(4)]
    kept = [llm.generate([list(prompt)], SamplingParams(seed=s, min_p=0.5, **params))[0] for s in range(4)]
    for out in kept:  # every sampled token had at least half the top token's probability
        assert all(lp.logprob >= lp.top[0][1] + torch.log(torch.tensor(0.5)).item() - 1e-5 for lp in out["logprobs"])
    assert any(lp.logprob < lp.top[0][1] - 0.7 for out in plain for lp in out["logprobs"])


@pytest.mark.parametrize("field, value, limit", [
    ("presence_penalty", 2.5, "[-2, 2]"), ("frequency_penalty", -3, "[-2, 2]"),
    ("repetition_penalty", 0, "> 0"), ("min_p", 1.5, "[0, 1]"), ("min_tokens", -1, ">= 0"),
    ("logprobs", 21, "[0, 20]"), ("prompt_logprobs", -1, "[0, 20]"),
    ("logit_bias", {"5": 101}, "[-100, 100]"), ("logit_bias", {"x": 1}, "token ids"),
    ("logit_bias", [1], "object"), ("min_tokens", 65, "<= max_tokens"),
    ("frequency_penalty", float("nan"), "[-2, 2]"), ("min_tokens", True, ">= 0")])
def test_validation_names_field_and_limit(field, value, limit):
    with pytest.raises(RequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field
    assert field in str(err.value) and limit in str(err.value)


def test_a_stop_token_id_outside_the_vocabulary_is_refused(llm, prompt):
    """No step can emit it, so the stop it asks for would never match."""
    vocab = llm.engine.model.config.vocab_size
    with pytest.raises(RequestError) as err:
        llm.add_request(list(prompt), SamplingParams(stop_token_ids=[2, vocab]))
    assert err.value.param == "stop_token_ids" and str(err.value) == \
        f"stop_token_ids must be < vocab_size={vocab}, got {vocab}"
    assert not llm.has_unfinished()


def test_logit_bias_outside_the_vocabulary_is_refused(llm, prompt):
    with pytest.raises(RequestError) as err:
        llm.add_request(list(prompt), SamplingParams(logit_bias={4096: 1.0}))
    assert err.value.param == "logit_bias" and "4096" in str(err.value)
    assert not llm.has_unfinished()


def test_each_row_counts_the_committed_output_and_the_fills_to_its_left():
    from wedlm.engine.logits_processors import apply_controls
    from wedlm.engine.request import Sequence

    params = SamplingParams(min_tokens=4, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias={3: 2.0})
    seq = Sequence("r", [1, 2, 5], prompt_len=2, params=params, max_len=20, window_size=4, stop_ids=frozenset({0}))
    seq.window = [6, None, 6, 7]  # committed output [5]; fills at slots 0, 2, 3
    out = apply_controls(seq, torch.ones(4, 9), [1, 3, 4, 0])
    assert apply_controls(seq, torch.ones(0, 9), []).shape == (0, 9)
    prompt_only, plain = 0.5, 1.0  # 1 / 2 for tokens seen only in the prompt
    once = 0.5 - 0.5 - 0.25  # repetition, then one occurrence's frequency and presence
    twice = 0.5 - 1.0 - 0.25
    expected = torch.tensor([
        # token 0 is the stop id: -inf while fewer than min_tokens=4 tokens come before the row's
        [float("-inf"), prompt_only, prompt_only, 3.0, plain, once, once, plain, plain],  # offset 1: 5, 6
        [plain, prompt_only, prompt_only, 3.0, plain, once, twice, plain, plain],  # offset 3: 5, 6, 6; 4 before it
        [plain, prompt_only, prompt_only, 3.0, plain, once, twice, once, plain],  # offset 4: 5, 6, 6, 7
        [float("-inf"), prompt_only, prompt_only, 3.0, plain, once, plain, plain, plain],  # offset 0: 5 only
    ])
    assert torch.equal(out, expected)
