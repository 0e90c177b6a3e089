"""`verified` shrinks its window with the load of the forward (`window_for_load`) and still
equals `ar` greedy token for token: the shipped model at batch 1 and batch 32."""

from pathlib import Path

import pytest

from wedlm import LLM, SamplingParams
from wedlm.engine.chat import encode_chat
from wedlm.engine.decoders.verified import window_for_load

MODEL = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
QUESTIONS = ["Count from 1 to 30.", "Count down from 60 to 41.", "What is 47 + 38?", "What is 91 - 56?",
             "Reverse the list: Tom, Anna, Ben, Mia.", "Sort the list: pear, fig, apple.",
             "Count from 200 to 230 by 2.", "What is 18 + 77?"]


@pytest.mark.parametrize(("window", "requests", "budget", "slots"), [
    (16, 1, 64, 31), (16, 2, 64, 31), (16, 3, 64, 20), (16, 4, 64, 15), (16, 8, 64, 7), (16, 16, 64, 3),
    (16, 21, 64, 2), (16, 22, 64, 0), (16, 32, 64, 0), (16, 4, 128, 31), (16, 5, 128, 24), (16, 7, 128, 17),
    (16, 8, 128, 15), (16, 32, 128, 3), (16, 43, 128, 0), (4, 1, 5, 4), (4, 1, 64, 7), (4, 2, 5, 0),
    (8, 2, 12, 5), (1, 1, 128, 0)])
def test_window_for_load(window, requests, budget, slots):
    assert window_for_load(window, requests, budget) == slots


@pytest.fixture(scope="module")
def shipped():
    llm = LLM(str(MODEL), device="cpu", kv_block_size=16)
    prompts = [encode_chat(llm.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return llm, prompts


def _run(llm, prompts, decoding):
    params = SamplingParams(temperature=0, max_tokens=40, decoding=decoding)
    return llm.generate(prompts, [params] * len(prompts))


def test_batch_1_keeps_the_whole_window_and_equals_ar(shipped):
    llm, prompts = shipped
    for p in prompts[:3]:
        ar, ver = _run(llm, [p], "ar")[0], _run(llm, [p], "verified")[0]
        assert ver["token_ids"] == ar["token_ids"]
        # whole windows: W = 16 masks, after the drafts, in every forward after the first
        assert ver["stats"]["fed_tokens"] >= 16 * (ver["stats"]["decode_forwards"] - 1)
        assert ver["stats"]["decode_forwards"] < ar["stats"]["decode_forwards"]


def test_batch_1_feeds_drafts_and_a_whole_window_of_masks(shipped):
    """At batch 1 a window after accepted drafts holds the drafts and W masks (more than W slots):
    the masks after the drafts predict the next drafts, so a long confident answer commits more
    than W / 2 tokens per forward."""
    llm, prompts = shipped
    params = SamplingParams(temperature=0, max_tokens=120, decoding="verified")
    ver = llm.generate([prompts[0]], params)[0]  # "Count from 1 to 30."
    ar = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=120, decoding="ar"))[0]
    assert ver["token_ids"] == ar["token_ids"]
    stats = ver["stats"]
    assert stats["fed_tokens"] > 17 * stats["decode_forwards"]  # wider than anchor + W at some step
    assert stats["decode_tokens"] > 8 * stats["decode_forwards"]


def test_drafts_take_no_distance_penalty(shipped):
    """A lambda that lets `wedlm` fill only the leftmost mask per step leaves `verified`'s drafts
    as long as without it: drafts are chosen by entropy alone."""
    llm, prompts = shipped
    ar = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=120, decoding="ar"))[0]
    runs = [llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=120, decoding=d,
                                                      wedlm_pos_penalty_factor=lam))[0]
            for d, lam in [("verified", 0.0), ("verified", 1.0), ("wedlm", 1.0)]]
    assert runs[0]["token_ids"] == runs[1]["token_ids"] == ar["token_ids"]
    assert runs[0]["stats"]["decode_forwards"] == runs[1]["stats"]["decode_forwards"]
    assert runs[1]["stats"]["decode_tokens"] > 8 * runs[1]["stats"]["decode_forwards"]
    assert runs[2]["stats"]["decode_tokens"] < 2.5 * runs[2]["stats"]["decode_forwards"]


@pytest.mark.parametrize("budget", [None, 64])
def test_batch_32_shrinks_the_window_and_equals_ar(shipped, budget):
    """Default budget (128): 3 slots each while all 32 run, more as they finish; 64: no window
    (plain AR steps) while 22 or more run."""
    base, prompts = shipped
    llm = base if budget is None else LLM(str(MODEL), device="cpu", kv_block_size=16, verified_token_budget=budget)
    batch = (prompts * 4)[:32]
    ar = _run(llm, batch, "ar")
    ver = _run(llm, batch, "verified")
    assert [o["token_ids"] for o in ver] == [o["token_ids"] for o in ar]
    fed = sum(o["stats"]["fed_tokens"] for o in ver)
    forwards = sum(o["stats"]["decode_forwards"] for o in ver)
    if budget == 64:  # every request's forwards fed no window slot while 22 or more ran
        assert min(o["stats"]["commits"][1] for o in ver) == 1
        assert fed / forwards < 4
    else:
        assert fed / forwards < 8
        assert forwards < sum(o["stats"]["decode_forwards"] for o in ar)


def test_sampled_verified_keeps_its_window_and_its_seed(shipped):
    """A seeded sampled request draws the same tokens alone and among 32 (its window is not trimmed)."""
    llm, prompts = shipped
    sampled = SamplingParams(temperature=0.8, seed=7, max_tokens=24, decoding="verified")
    greedy = SamplingParams(temperature=0, max_tokens=24, decoding="verified")
    alone = llm.generate([prompts[0]], sampled)[0]
    batch = llm.generate((prompts * 4)[:32], [sampled] + [greedy] * 31)
    assert batch[0]["token_ids"] == alone["token_ids"]
    assert batch[0]["stats"]["fed_tokens"] >= 16 * (batch[0]["stats"]["decode_forwards"] - 1)


def test_verified_token_budget_is_checked():
    with pytest.raises(ValueError, match="verified_token_budget must be an integer >= 1, got 0"):
        LLM(str(MODEL), device="cpu", verified_token_budget=0)
