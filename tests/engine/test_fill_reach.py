"""Masks beyond the fill rule's reach are not fed (`fill.fill_reach`, `streaming.plan_filled_first`):
with tau, lambda > 0 and the leftmost fallback, a mask whose distance penalty alone exceeds tau
is never filled, and being fed last it changes no other row's logits."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.decoders import streaming
from wedlm.engine.decoders.fill import ENTROPY_ATOL, ENTROPY_RTOL, fill_reach
from wedlm.engine.decoders.streaming import StreamingDecoder, fill_masks, plan_filled_first

MASK = 99
SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"


def params(**kw):
    return SamplingParams(temperature=0, **kw).resolve()


def test_reach_is_the_last_distance_whose_penalty_stays_within_tau():
    assert fill_reach(params(wedlm_entropy_threshold=0.15, wedlm_pos_penalty_factor=0.015)) == 10
    assert fill_reach(params(wedlm_entropy_threshold=0.3, wedlm_pos_penalty_factor=0.1)) == 3
    assert fill_reach(params(wedlm_entropy_threshold=0.0, wedlm_pos_penalty_factor=0.5)) == 0
    # the tolerance keeps a distance whose penalty lands on tau within float rounding
    tau = 0.3
    lam = (tau + 0.5 * (ENTROPY_ATOL + ENTROPY_RTOL * tau)) / 4
    assert fill_reach(params(wedlm_entropy_threshold=tau, wedlm_pos_penalty_factor=lam)) == 4
    # no bound where any mask may be filled
    assert fill_reach(params(wedlm_entropy_threshold=None, wedlm_pos_penalty_factor=0.1)) is None
    assert fill_reach(params(wedlm_entropy_threshold=0.3, wedlm_pos_penalty_factor=0.1,
                             wedlm_fallback="argmin")) is None
    assert fill_reach(params(wedlm_entropy_threshold=0.3, wedlm_pos_penalty_factor=0.0)) is None
    assert fill_reach(params(wedlm_entropy_threshold=math.inf, wedlm_pos_penalty_factor=0.1)) is None
    # tau / lambda beyond a float: accepted knobs, no bound (not an overflow in the step)
    assert fill_reach(params(wedlm_entropy_threshold=0.4, wedlm_pos_penalty_factor=1e-320)) is None
    assert fill_reach(params(wedlm_entropy_threshold=1e308, wedlm_pos_penalty_factor=0.5)) is None


def seq_with(window, stop_by_ar=False, **kw):
    p = SamplingParams(temperature=0, wedlm_stop_by_ar=stop_by_ar, **kw).resolve()
    return SimpleNamespace(window=list(window), tokens=[5, 6, 7], num_cached=3, params=p, stop_ids={2},
                           generator=None, grammar=None)


@pytest.mark.parametrize("seed", range(20))
def test_no_mask_beyond_the_reach_is_ever_filled(seed):
    """Random windows of 16 masks, rows from near-certain to flat (sharpness 0-40): every filled
    mask lies within the reach, and the rule, given every row, fills the same masks as given
    only the rows within it."""
    g = torch.Generator().manual_seed(seed)
    tau, lam = [(0.15, 0.015), (0.5, 0.1), (1.0, 0.25)][seed % 3]
    kw = dict(wedlm_entropy_threshold=tau, wedlm_pos_penalty_factor=lam)
    reach = fill_reach(params(**kw))
    sharp = torch.rand(16, 1, generator=g) * 40
    logits = torch.randn(16, 32, generator=g) + sharp * torch.nn.functional.one_hot(
        torch.randint(0, 32, (16,), generator=g), 32)
    every = seq_with([None] * 16, **kw)
    fill_masks(every, list(range(16)), logits)
    filled = [i for i, t in enumerate(every.window) if t is not None]
    assert max(filled) <= reach
    near = seq_with([None] * 16, **kw)
    fill_masks(near, list(range(reach + 1)), logits[:reach + 1])
    assert near.window == every.window


def test_plan_feeds_masks_up_to_the_reach_and_keeps_the_rest_in_the_window():
    seq = seq_with([11, None, 12] + [None] * 13, wedlm_entropy_threshold=0.15, wedlm_pos_penalty_factor=0.015)
    plan = plan_filled_first(seq, MASK, reach=10)
    masks = [1] + list(range(3, 12))  # distances 0 and 2..10 from slot 1
    assert plan.token_ids == [11, 12] + [MASK] * len(masks)
    assert plan.positions == [3, 5] + [3 + s for s in masks]
    assert plan.row_slots == masks and plan.logit_rows == list(range(2, 2 + len(masks)))
    assert seq.window == [11, None, 12] + [None] * 13
    with_ar = plan_filled_first(seq_with(seq.window, stop_by_ar=True), MASK, leftmost_from_ar=True, reach=10)
    assert with_ar.row_slots == masks and with_ar.logit_rows == [0] + list(range(3, 2 + len(masks)))
    assert plan_filled_first(seq, MASK).row_slots == [1] + list(range(3, 16))  # no reach: every mask
    # the AR head's anchor row for a window starting with a mask; the mask rows still end at the reach
    anchored = seq_with([None, 12] + [None] * 14, stop_by_ar=True)
    anchored.num_cached = 2
    plan = plan_filled_first(anchored, MASK, leftmost_from_ar=True, reach=10)
    assert plan.anchor and plan.token_ids == [12] + [MASK] * 10
    assert plan.row_slots == list(range(2, 11)) and plan.logit_rows == list(range(2, 11))


def test_the_decoder_bounds_only_unconstrained_requests():
    decoder = StreamingDecoder(mask_token_id=MASK)
    seq = seq_with([None] * 16, wedlm_entropy_threshold=0.15, wedlm_pos_penalty_factor=0.015)
    assert decoder.plan(seq).row_slots == list(range(11))
    seq.grammar = object()  # structured outputs walk every mask row (`constrain.fill_in_order`)
    assert decoder.plan(seq).row_slots == list(range(16))


QUESTIONS = ["Reverse the list [1, 2, 3, 4, 5].", "Sort the list [5, 3, 9, 1].", "What is 37 + 48?",
             "Count from 3 to 40."]


def answers_with_and_without_the_reach(llm, monkeypatch):
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True) for q in QUESTIONS]
    sp = SamplingParams(temperature=0, max_tokens=200, logprobs=2)
    bounded = llm.generate(prompts, sp)
    with monkeypatch.context() as patch:
        patch.setattr(streaming, "fill_reach", lambda p: None)
        every = llm.generate(prompts, sp)
    return bounded, every


def check_same_answers_with_fewer_rows(bounded, every, rows_alone: bool):
    """The same tokens, forwards and log-probabilities, with fewer rows fed in all. The rows kept
    compute the same values; where every kernel computes a row alone (`ModelRunner.rows_alone`)
    they are the same bits, else a matmul whose blocking follows the row count (oneDNN's, on an
    AVX-512 AMD CPU) may round them differently, within float32 rounding."""
    for b, e in zip(bounded, every):
        assert b["token_ids"] == e["token_ids"]
        assert b["stats"]["decode_forwards"] == e["stats"]["decode_forwards"]
        got = [(lp.token_id, [t for t, _ in lp.top]) for lp in b["logprobs"]]
        assert got == [(lp.token_id, [t for t, _ in lp.top]) for lp in e["logprobs"]]
        got = torch.tensor([[lp.logprob] + [v for _, v in lp.top] for lp in b["logprobs"]])
        want = torch.tensor([[lp.logprob] + [v for _, v in lp.top] for lp in e["logprobs"]])
        if rows_alone:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert b["stats"]["fed_tokens"] <= e["stats"]["fed_tokens"]
    fed = [(b["stats"]["fed_tokens"], e["stats"]["fed_tokens"]) for b, e in zip(bounded, every)]
    assert sum(b for b, _ in fed) < sum(e for _, e in fed), fed


def test_the_shipped_model_answers_the_same_with_fewer_rows(monkeypatch):
    llm = LLM(str(SHIPPED), device="cpu", enforce_eager=True)  # W = 16: the model's default
    check_same_answers_with_fewer_rows(*answers_with_and_without_the_reach(llm, monkeypatch),
                                       llm.engine.runner.rows_alone)


@pytest.mark.slow
def test_the_shipped_model_answers_the_same_with_fewer_rows_compiled(monkeypatch):
    """The default (compiled) CPU forward, whose fill scores take the estimate path."""
    llm = LLM(str(SHIPPED), device="cpu")
    check_same_answers_with_fewer_rows(*answers_with_and_without_the_reach(llm, monkeypatch),
                                       llm.engine.runner.rows_alone)
