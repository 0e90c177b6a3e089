"""Stops decided by the AR head (`wedlm_stop_by_ar`, decoders/streaming.py): the leftmost mask
is filled from the AR head's next-token row of the same forward, and no other mask takes a
stop token."""

from types import SimpleNamespace

import pytest
import torch

from wedlm import SamplingParams
from wedlm.engine.decoders.streaming import fill_masks, plan_filled_first
from wedlm.engine.errors import RequestError

MASK = 99


def seq_with(window, tokens=(5, 6, 7), num_cached=3, **params):
    p = SamplingParams(temperature=0, wedlm_stop_by_ar=True, **params).resolve()
    return SimpleNamespace(window=list(window), tokens=list(tokens), num_cached=num_cached, params=p,
                           stop_ids={2}, generator=None)


def test_plan_reads_the_last_slot_of_the_leading_run_for_the_leftmost_mask():
    seq = seq_with([11, 12, None, 13, None])
    plan = plan_filled_first(seq, MASK, leftmost_from_ar=True)
    assert plan.token_ids == [11, 12, 13, MASK, MASK]
    assert plan.positions == [3, 4, 6, 5, 7]
    assert (plan.logit_rows, plan.row_slots, plan.anchor) == ([1, 4], [2, 4], False)
    assert plan.leftmost_ar
    plain = plan_filled_first(seq, MASK)
    assert (plain.logit_rows, plain.row_slots) == ([3, 4], [2, 4]) and not plain.leftmost_ar
    full = plan_filled_first(seq_with([11, 12, 13]), MASK, leftmost_from_ar=True)  # for the slot after it
    assert (full.logit_rows, full.row_slots, full.anchor) == ([2], [3], False) and full.leftmost_ar


def test_plan_uses_the_anchor_when_the_window_starts_with_a_mask():
    seq = seq_with([None, 12, None], num_cached=2)  # the last committed token is not cached yet
    plan = plan_filled_first(seq, MASK, leftmost_from_ar=True)
    assert (plan.token_ids, plan.logit_rows, plan.row_slots, plan.anchor) == ([12, MASK, MASK], [2], [2], True)
    assert plan.leftmost_ar
    cached = seq_with([None, 12, None], num_cached=3)  # nothing fed before the window: mask rows
    plan = plan_filled_first(cached, MASK, leftmost_from_ar=True)
    assert (plan.logit_rows, plan.row_slots, plan.anchor) == ([1, 2], [0, 2], False)
    assert not plan.leftmost_ar


def one_hot_logits(ids, vocab=8, high=20.0):
    logits = torch.zeros(len(ids), vocab)
    logits[torch.arange(len(ids)), torch.tensor(ids)] = high
    return logits


def test_only_the_ar_row_may_fill_a_stop_token():
    # rows: AR row for slot 0 (says stop), mask rows for slots 1..3 (stop, 4, 5); all confident
    seq = seq_with([None] * 4, wedlm_entropy_threshold=1.0, wedlm_pos_penalty_factor=0.0)
    fill_masks(seq, [0, 1, 2, 3], one_hot_logits([2, 2, 4, 5]), ar_first=True)
    assert seq.window == [2, None, 4, 5]
    plain = seq_with([None] * 4, wedlm_entropy_threshold=1.0, wedlm_pos_penalty_factor=0.0)
    fill_masks(plain, [0, 1, 2, 3], one_hot_logits([2, 2, 4, 5]))  # Algorithm 1: any mask may stop
    assert plain.window == [2, 2, 4, 5]


def test_the_ar_row_is_filled_even_when_no_mask_passes_tau():
    logits = torch.zeros(3, 8)  # uniform rows: entropy log 8 > tau everywhere
    logits[1, 4] = 30.0  # one confident far mask
    seq = seq_with([7, None, None, None], wedlm_entropy_threshold=0.5, wedlm_pos_penalty_factor=0.0)
    fill_masks(seq, [1, 2, 3], logits, ar_first=True)
    assert seq.window == [7, 0, 4, None]  # AR argmax of a uniform row is id 0; slot 2 passed tau


def test_tau_none_still_fills_the_argmin_mask_besides_the_ar_row():
    logits = torch.zeros(3, 8)  # row 0 (AR) uniform, row 2 confident: the argmin is slot 3
    logits[2, 5] = 30.0
    seq = seq_with([7, None, None, None], wedlm_entropy_threshold=None, wedlm_pos_penalty_factor=0.0)
    fill_masks(seq, [1, 2, 3], logits, ar_first=True)
    assert seq.window == [7, 0, None, 5]
    plain = seq_with([7, None, None, None], wedlm_entropy_threshold=None, wedlm_pos_penalty_factor=0.0)
    fill_masks(plain, [1, 2, 3], logits)
    assert plain.window == [7, None, None, 5]


def test_greedy_with_tau_zero_equals_ar_token_for_token(make_llm):
    """tau 0 fills no mask by entropy, so every token comes from the AR head: the output and the
    number of forwards equal `ar`'s."""
    llm = make_llm(wedlm_window_size=6)
    prompts = [[(5 * i + 3 * k) % 240 + 4 for i in range(4 + k)] for k in range(3)]
    ar = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, decoding="ar", ignore_eos=True))
    wd = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, decoding="wedlm", ignore_eos=True,
                                              wedlm_entropy_threshold=0.0, wedlm_stop_by_ar=True))
    for a, w in zip(ar, wd):
        assert w["token_ids"] == a["token_ids"] and len(a["token_ids"]) == 20
        assert w["stats"]["decode_forwards"] == a["stats"]["decode_forwards"] == 20


def test_leftmost_token_of_every_step_is_ar_given_the_committed_text(make_llm):
    """With every mask filled each step (tau inf), the first token committed by each forward is
    the AR argmax after the text committed before it."""
    llm = make_llm(wedlm_window_size=5)
    engine = llm.engine
    prompt = [9, 40, 41, 42, 43]
    rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=24, decoding="wedlm", ignore_eos=True,
                                                 wedlm_entropy_threshold=float("inf"), wedlm_stop_by_ar=True))
    seq = engine.seqs[rid]
    steps = []
    while llm.has_unfinished():
        before = list(seq.tokens)
        new = [t for d in llm.step() for t in d.new_token_ids]
        if new:
            steps.append((before, new[0]))
    assert len(steps) > 2 and len(seq.tokens) - len(prompt) == 24
    for before, first in steps:
        with torch.inference_mode():
            ref = llm.generate([before], SamplingParams(temperature=0, max_tokens=1, decoding="ar",
                                                        ignore_eos=True))[0]["token_ids"][0]
        assert first == ref


def test_sampled_requests_run_and_repeat_with_a_seed(make_llm):
    llm = make_llm(wedlm_window_size=4)
    p = SamplingParams(temperature=1.0, max_tokens=16, decoding="wedlm", seed=7, wedlm_stop_by_ar=True)
    a, b = (llm.generate([[3, 4, 5]], p)[0]["token_ids"] for _ in range(2))
    assert a == b and 1 <= len(a) <= 16


def test_validation_and_model_default():
    with pytest.raises(RequestError, match="^wedlm_stop_by_ar must be true or false") as info:
        SamplingParams(wedlm_stop_by_ar=1)
    assert info.value.param == "wedlm_stop_by_ar"
    assert SamplingParams().resolve().wedlm_stop_by_ar is False
    assert SamplingParams().resolve({"wedlm_stop_by_ar": True}).wedlm_stop_by_ar is True
    assert SamplingParams(wedlm_stop_by_ar=False).resolve({"wedlm_stop_by_ar": True}).wedlm_stop_by_ar is False


def test_stop_in_run_lets_a_stop_close_a_run_filled_in_the_same_forward():
    # AR row for slot 0 (4), mask rows: slot 1 (5), slot 2 (stop), slot 3 (stop); all confident
    logits = one_hot_logits([4, 5, 2, 2])
    seq = seq_with([None] * 4, wedlm_entropy_threshold=1.0, wedlm_pos_penalty_factor=0.0, wedlm_stop_in_run=True)
    fill_masks(seq, [0, 1, 2, 3], logits, ar_first=True)
    assert seq.window == [4, 5, 2, None]  # the stop after the run is kept; nothing after the first stop
    strict = seq_with([None] * 4, wedlm_entropy_threshold=1.0, wedlm_pos_penalty_factor=0.0)
    fill_masks(strict, [0, 1, 2, 3], logits, ar_first=True)
    assert strict.window == [4, 5, None, None]  # stop_by_ar alone: no mask row ends the answer


def test_stop_in_run_refuses_a_stop_behind_a_gap():
    # slot 1's row is uniform (entropy log 8 > tau): not filled, so slot 2's stop sits behind a gap
    logits = one_hot_logits([4, 5, 2, 6])
    logits[1] = 0.0
    seq = seq_with([None] * 4, wedlm_entropy_threshold=1.0, wedlm_pos_penalty_factor=0.0, wedlm_stop_in_run=True)
    fill_masks(seq, [0, 1, 2, 3], logits, ar_first=True)
    assert seq.window == [4, None, None, 6]


def test_stop_in_run_counts_slots_filled_in_earlier_steps_as_part_of_the_run():
    # window [m, 11, m, m]: masks are slots 0, 2, 3; AR row fills slot 0, mask row fills slot 2,
    # and slot 3's stop closes the run 0..3 (slot 1 was filled by an earlier step)
    seq = seq_with([None, 11, None, None], wedlm_entropy_threshold=1.0, wedlm_pos_penalty_factor=0.0,
                   wedlm_stop_in_run=True)
    fill_masks(seq, [0, 2, 3], one_hot_logits([4, 5, 2]), ar_first=True)
    assert seq.window == [4, 11, 5, 2]


def test_stop_in_run_validation_and_model_default():
    with pytest.raises(RequestError, match="^wedlm_stop_in_run must be true or false") as info:
        SamplingParams(wedlm_stop_in_run="yes")
    assert info.value.param == "wedlm_stop_in_run"
    assert SamplingParams().resolve().wedlm_stop_in_run is False
    assert SamplingParams().resolve({"wedlm_stop_in_run": True}).wedlm_stop_in_run is True
    assert SamplingParams(wedlm_stop_in_run=False).resolve({"wedlm_stop_in_run": True}).wedlm_stop_in_run is False
