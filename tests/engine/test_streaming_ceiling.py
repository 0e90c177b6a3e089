"""The ceiling of Streaming Parallel Decoding: at most min(W / 2, m) tokens per forward in the
steady state (plus a one-off surplus of the first forward: `fewest_forwards` below).

Driven with an oracle (one-hot logits on the right token at every mask, entropy 0), the
streaming decoder of Algorithm 1 commits, per forward, the filled slots of the previous
forward; the masks appended for them are first predicted by the next forward. So a step that
commits k slots can fill at most W - k masks, and the steady state alternates k and W - k:
W / 2 tokens per forward however confident the model is (8 at W = 16: the paper's 8.10 on
"Count from 1 to 200"). The distance penalty caps the fills per forward too: with entropy 0,
mask i passes when lambda * d_i < tau, i.e. m = ceil(tau / lambda) slots, and the decoder then
commits min(m, W / 2) per forward in the steady state. When tau / lambda is whole, the slot
d = tau / lambda sits on the boundary: float32(lambda * d) may fall just below tau, so this
oracle (entropy exactly 0) gets one more slot (6 at tau 0.1, lambda 0.02), while a model whose
entropies are above float32 rounding gets tau / lambda (the shipped model's 4.98 on the demo).
"""

from __future__ import annotations

import pytest
import torch

from wedlm.engine.decoders.streaming import StreamingDecoder
from wedlm.engine.request import Sequence
from wedlm.engine.sampling_params import SamplingParams

VOCAB, MASK = 32, 31


def target(pos: int) -> int:
    """The oracle's token at logical position pos (never [MASK])."""
    return 1 + pos % 29


def run(window: int, tau: float, lam: float, n_out: int) -> list[int]:
    """Greedy streaming decoding of n_out tokens under the oracle; commits per forward."""
    params = SamplingParams(temperature=0, max_tokens=n_out, wedlm_entropy_threshold=tau,
                            wedlm_pos_penalty_factor=lam).resolve()
    prompt = [target(p) for p in range(5)]
    seq = Sequence("r", list(prompt), len(prompt), params, len(prompt) + n_out, window)
    dec = StreamingDecoder(MASK)
    dec.init(seq)
    per_forward = []
    for _ in range(2 * n_out + 2):  # a decoder that stops committing fails below, not hangs
        if seq.budget_left == 0:
            break
        plan = dec.plan(seq)
        rows = [plan.positions[r] for r in plan.logit_rows]
        logits = torch.full((len(rows), VOCAB), -1e4)
        logits[torch.arange(len(rows)), torch.tensor([target(p) for p in rows], dtype=torch.long)] = 0.0
        res = dec.update(seq, plan, logits, logits.argmax(-1).tolist())
        seq.tokens += res.committed
        per_forward.append(len(res.committed))
    assert seq.budget_left == 0, f"{n_out - seq.budget_left} of {n_out} tokens after {len(per_forward)} forwards"
    assert seq.output_ids == [target(p) for p in range(5, 5 + n_out)]
    return per_forward


@pytest.mark.parametrize("window", [4, 16, 32])
def test_confident_oracle_commits_half_the_window_per_forward(window):
    per_forward = run(window, tau=0.4, lam=0.0, n_out=10 * window)
    # forward 1 fills every mask, forward 2 commits them, and so on: 0, W, 0, W, ...
    # (the last forward commits its fills at once: the request ends inside the run)
    assert per_forward[:4] == [0, window, 0, window]
    assert len(per_forward) == 2 * 10 - 1
    assert sum(per_forward) / len(per_forward) == pytest.approx(window / 2, rel=0.06)


@pytest.mark.parametrize("tau,lam,expect", [(0.09, 0.02, 5), (0.07, 0.02, 4), (0.11, 0.02, 6),
                                             (0.19, 0.02, 8), (0.115, 0.01, 8), (0.05, 0.1, 1)])
def test_distance_penalty_caps_fills_per_forward(tau, lam, expect):
    """tau / lambda not whole: m = ceil(tau / lambda) slots pass, min(m, W / 2) per forward."""
    per_forward = run(16, tau=tau, lam=lam, n_out=400)
    steady = per_forward[4:-2]
    assert sum(steady) / len(steady) == pytest.approx(expect, rel=0.05)


def test_whole_ratio_boundary_slot_passes_only_at_entropy_zero():
    """tau 0.1, lambda 0.02: float32(0.02 * 5) < 0.1, so the oracle (entropy 0) fills d = 0..5,
    6 per forward; the shipped model, whose entropies are not 0, commits about 5 there."""
    per_forward = run(16, tau=0.1, lam=0.02, n_out=400)
    steady = per_forward[4:-2]
    assert sum(steady) / len(steady) == pytest.approx(6, rel=0.05)


def fewest_forwards(n_tokens: int, window: int, m: int) -> int:
    """The bound derived in docs/method.md, "The ceiling": a forward fills at most
    f_t <= min(m, W - f_{t-1}) masks (the slots filled by the previous forward are inputs,
    not masks), so N forwards produce at most N * m tokens when m <= W / 2, else
    N * W / 2 plus, for odd N, the one-off min(m, W) - W / 2 of the first forward."""
    m = min(m, window)
    n = 1
    while True:
        most = n * m if 2 * m <= window else n * window // 2 + (n % 2) * (m - window // 2)
        if most >= n_tokens:
            return n
        n += 1


@pytest.mark.parametrize("tau,lam,m", [(0.19, 0.02, 10), (0.21, 0.02, 11), (0.39, 0.02, 20),
                                       (0.09, 0.02, 5), (0.4, 0.0, 16)])
def test_forwards_of_the_demo_answer_match_the_bound(tau, lam, m):
    """The demo's 891 tokens at W = 16: 179 forwards with at most m = 5 fills per forward,
    112 (7.96 per forward) with m = 10 and 111 (8.03) once m >= 11. The oracle reaches the
    bound exactly (docs/method.md, "The ceiling", records the shipped model at the same counts)."""
    per_forward = run(16, tau=tau, lam=lam, n_out=891)
    assert len(per_forward) == fewest_forwards(891, 16, m)
    assert len(per_forward) == {5: 179, 10: 112}.get(m, 111)


STOP = 30


def run_to_stop(window: int, tau: float, lam: float, n_answer: int, **stops) -> int:
    """Forwards to decode an answer of n_answer oracle tokens followed by a stop token (every
    position after the answer says STOP), greedy; `stops`: wedlm_stop_by_ar / wedlm_stop_in_run."""
    params = SamplingParams(temperature=0, max_tokens=2 * n_answer, wedlm_entropy_threshold=tau,
                            wedlm_pos_penalty_factor=lam, **stops).resolve()
    prompt = [target(p) for p in range(5)]
    end = len(prompt) + n_answer  # the stop's logical position
    seq = Sequence("r", list(prompt), len(prompt), params, len(prompt) + 2 * n_answer, window,
                   stop_ids=frozenset({STOP}))
    dec = StreamingDecoder(MASK)
    dec.init(seq)
    for forwards in range(1, 2 * n_answer + 2):
        plan = dec.plan(seq)
        k = next((i for i, t in enumerate(seq.window) if t is None), len(seq.window))
        slots = ([k] if plan.anchor else []) + plan.row_slots  # the window slot each logits row predicts
        wanted = [target(p) if p < end else STOP for p in (len(seq.tokens) + s for s in slots)]
        logits = torch.full((len(slots), VOCAB), -1e4)
        logits[torch.arange(len(slots)), torch.tensor(wanted, dtype=torch.long)] = 0.0
        res = dec.update(seq, plan, logits, logits.argmax(-1).tolist())
        seq.tokens += res.committed
        if STOP in res.committed:
            out = seq.output_ids  # the engine ends the request at the first stop of a committed run
            assert out[:out.index(STOP) + 1] == [target(p) for p in range(5, end)] + [STOP]
            return forwards
    raise AssertionError("no stop")


def test_a_stop_closing_a_run_saves_the_forward_that_stops_by_the_ar_head_cost():
    """The demo's 890 answer tokens and its stop at W = 16, m = ceil(0.15 / 0.0125) = 12 fills per
    forward: Algorithm 1 and `wedlm_stop_in_run` fill the stop with the last digits (111 forwards,
    the bound for 891 tokens); stops by the AR head alone wait one forward for the AR row (112)."""
    assert fewest_forwards(891, 16, 12) == 111
    assert run_to_stop(16, 0.15, 0.0125, 890) == 111
    assert run_to_stop(16, 0.15, 0.0125, 890, wedlm_stop_by_ar=True) == 112
    assert run_to_stop(16, 0.15, 0.0125, 890, wedlm_stop_by_ar=True, wedlm_stop_in_run=True) == 111
    # stop_in_run without stop_by_ar changes nothing: any mask may stop already
    assert run_to_stop(16, 0.15, 0.0125, 890, wedlm_stop_in_run=True) == 111
