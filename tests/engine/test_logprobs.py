"""Logprobs on the shipped model: `ar` equals a direct teacher-forced forward's log_softmax,
`verified` reports the same values as `ar`, the mask-slot decoders report the distribution that
filled each slot, prompt logprobs equal the direct forward, and streamed equals batch."""

from pathlib import Path

import pytest
import torch

from wedlm import SamplingParams
from wedlm.model import DenseAttention, load_model

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped model is missing")


@pytest.fixture(scope="module")
def llm(shipped_llm):
    return shipped_llm


@pytest.fixture(scope="module")
def prompt(llm):
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": "What is 47 + 38?"}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def direct():
    """log_softmax of a direct causal forward (a freshly loaded model, [MASK] excluded): [len(ids), V]."""
    model = load_model(str(SHIPPED), dtype="float32", device="cpu").eval()

    def run(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], DenseAttention())[0].float()
        logits[:, model.config.mask_token_id] = float("-inf")
        return torch.log_softmax(logits, -1)

    return run


def generate(llm, prompt, decoding, **kw):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 32, "decoding": decoding, "logprobs": 5, **kw})
    return llm.generate([list(prompt)], params)[0]


@pytest.mark.parametrize("decoding", ("ar", "verified"))
def test_ar_head_logprobs_equal_a_direct_forward(llm, prompt, direct, decoding):
    out = generate(llm, prompt, decoding)
    assert out["finish_reason"] == "stop" and len(out["logprobs"]) == len(out["token_ids"]) > 3
    ref = direct(list(prompt) + out["token_ids"][:-1])[len(prompt) - 1:]
    for i, (token, lp) in enumerate(zip(out["token_ids"], out["logprobs"])):
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(float(ref[i, token]), abs=1e-4)
        values, ids = ref[i].topk(5)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)


@pytest.mark.parametrize("decoding", ("ar", "wedlm", "blockwise", "verified"))
def test_top_logprobs_sorted_and_the_greedy_choice_is_first(llm, prompt, decoding):
    out = generate(llm, prompt, decoding)
    assert out["text"] == "47 + 38 = 85"
    assert [lp.token_id for lp in out["logprobs"]] == out["token_ids"]
    for lp in out["logprobs"]:
        values = [v for _, v in lp.top]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert lp.top[0] == (lp.token_id, lp.logprob)  # greedy: the argmax of its own distribution
        assert lp.logprob <= 0


def test_mask_slot_logprobs_differ_from_the_ar_head(llm, prompt):
    ar = generate(llm, prompt, "ar")
    wedlm = generate(llm, prompt, "wedlm", wedlm_stop_by_ar=False)
    assert wedlm["token_ids"] == ar["token_ids"]
    assert [round(lp.logprob, 3) for lp in wedlm["logprobs"]] != [round(lp.logprob, 3) for lp in ar["logprobs"]]


def test_sampled_logprobs_are_of_the_processed_logits_at_temperature_one(llm, prompt, direct):
    out = generate(llm, prompt, "ar", temperature=0.7, top_k=3, seed=5, max_tokens=12)
    ref = direct(list(prompt) + out["token_ids"][:-1])[len(prompt) - 1:]
    for i, lp in enumerate(out["logprobs"]):
        assert lp.logprob == pytest.approx(float(ref[i, lp.token_id]), abs=1e-4)


def test_prompt_logprobs_equal_a_direct_forward(llm, prompt, direct):
    out = generate(llm, prompt, "wedlm", prompt_logprobs=2, logprobs=None)
    assert "logprobs" not in out
    plp = out["prompt_logprobs"]
    assert len(plp) == len(prompt) and plp[0] is None
    ref = direct(list(prompt))
    for i in range(1, len(prompt)):
        assert plp[i].token_id == prompt[i]
        assert plp[i].logprob == pytest.approx(float(ref[i - 1, prompt[i]]), abs=1e-4)
        assert [t for t, _ in plp[i].top] == ref[i - 1].topk(2).indices.tolist()


@pytest.mark.parametrize("decoding", ("wedlm", "verified"))
def test_streamed_logprobs_equal_batch(llm, prompt, decoding):
    params = SamplingParams(temperature=0, max_tokens=32, decoding=decoding, logprobs=2, prompt_logprobs=1)
    batch = llm.generate([list(prompt)], params)[0]
    ids, lps, first = [], [], None
    for d in llm.generate_stream([list(prompt)], params):
        assert len(d["logprobs"]) == len(d["new_token_ids"])
        ids += d["new_token_ids"]
        lps += d["logprobs"]
        first = first or d["prompt_logprobs"]
    assert ids == batch["token_ids"] and lps == batch["logprobs"]
    assert first == batch["prompt_logprobs"]


def test_logprobs_zero_has_no_alternatives(llm, prompt):
    out = generate(llm, prompt, "wedlm", logprobs=0)
    assert out["logprobs"] and all(lp.top == () for lp in out["logprobs"])
