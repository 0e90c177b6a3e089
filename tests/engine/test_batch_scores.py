"""Fill scores from the batch-wide softmax (`sampling.SoftmaxRows`, all windows at once) equal
the per-window reference computed from the logits (`fill.fill_scores` without `scores`)."""

import torch

from wedlm import SamplingParams
from wedlm.engine.decoders.fill import fill_scores
from wedlm.engine.sampling import RowScores, SoftmaxRows


def test_batch_scores_equal_per_window_reference():
    logits = 4 * torch.randn(9, 300, generator=torch.Generator().manual_seed(0))
    logits[:, 7] = float("-inf")  # the banned [MASK] column
    batch = SoftmaxRows(logits)
    greedy = SamplingParams(temperature=0.0, wedlm_pos_penalty_factor=0.1)
    for start, stop in ((0, 1), (2, 7), (7, 9)):
        dist = range(stop - start)
        ref = fill_scores(logits[start:stop], greedy, dist)
        fast = fill_scores(logits[start:stop], greedy, dist, RowScores(batch, start, stop))
        assert torch.equal(ref[0], fast[0]) and torch.equal(ref[1], fast[1])
    sliced = RowScores(batch, 2, 7)[3:]
    assert (sliced.start, sliced.stop) == (5, 7)
    assert RowScores(batch, 2, 7)[9:].start == RowScores(batch, 2, 7)[9:].stop  # empty
    sampled = SamplingParams(temperature=0.7, top_k=20, wedlm_pos_penalty_factor=0.1)  # sampled requests never use the batch softmax
    ref = fill_scores(logits[2:7], sampled, range(5))
    fast = fill_scores(logits[2:7], sampled, range(5), RowScores(batch, 2, 7))
    assert torch.equal(ref[1], fast[1])


def test_in_place_entropy_equals_the_formula():
    from wedlm.engine.sampling import entropy

    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 128):
        p = torch.softmax(6 * torch.randn(n, 4096, generator=g), -1)
        p[:, 3] = 0  # a banned column: 0 * log(1e-30) = 0
        assert torch.equal(entropy(p), -(p * p.clamp_min(1e-30).log()).sum(dim=-1))


def test_batch_argmax_draws_equal_per_window_draws():
    """Greedy draws from the batch-wide argmax (`fill.draw_rows` with scores) are the ids that
    `fill.draw` gives on the window's own probs rows, ties included (the first index wins)."""
    from wedlm.engine.decoders.fill import draw, draw_rows

    logits = 4 * torch.randn(9, 300, generator=torch.Generator().manual_seed(1))
    logits[:, 7] = float("-inf")
    logits[3, 20] = logits[3, 40] = logits[3].max() + 1  # a tie: both rows keep the first
    batch = SoftmaxRows(logits)
    greedy = SamplingParams(temperature=0.0, wedlm_pos_penalty_factor=0.1)
    for start, stop, rows in ((0, 1, [0]), (2, 7, [0, 1, 3]), (2, 7, [4]), (7, 9, [])):
        scores = RowScores(batch, start, stop)
        probs, _ = fill_scores(logits[start:stop], greedy, range(stop - start), scores)
        assert draw_rows(probs, rows, greedy, None, scores) == draw(probs[rows], greedy, None)
    assert batch.argmax(3, 4) == [20]
    assert batch.argmax(0, 9) == torch.softmax(logits, -1).argmax(-1).tolist()


def test_estimated_scores_take_the_exact_decisions():
    """With the C++ estimate (`SoftmaxRows(..., estimate=True)`) the fill decisions (which masks
    pass tau, the argmin) are those of the exact scores: the estimate decides when every score is
    clear of tau (probs None), and the exact path runs when one is within the tolerance (tau set
    to an exact score itself) or when the argmin is a near tie (two equal rows, no penalty)."""
    import pytest

    from wedlm.engine.decoders.fill import argmin, below_tau
    from wedlm.engine.fast_model import use_native_ops

    if not use_native_ops():
        pytest.skip("the engine's C++ operators did not build")
    gen = torch.Generator().manual_seed(2)
    logits = torch.cat([s * torch.randn(8, 500, generator=gen) for s in (1.0, 4.0, 12.0, 40.0)])
    logits[:, 7] = float("-inf")
    logits[27] = logits[26]  # equal rows: equal entropies
    exact_rows, estimated = SoftmaxRows(logits), SoftmaxRows(logits, estimate=True)

    def both(params, start):
        dist, rows = range(8), logits[start:start + 8]
        return (fill_scores(rows, params, dist, RowScores(exact_rows, start, start + 8)),
                fill_scores(rows, params, dist, RowScores(estimated, start, start + 8)))

    decided = calls = 0
    for start in range(0, 25, 4):
        on_tau = both(SamplingParams(temperature=0.0, wedlm_pos_penalty_factor=0.02,
                                     wedlm_entropy_threshold=None), start)[0][1]
        for tau in (None, 0.0, 0.15, 0.5, 2.0, float(on_tau[3]), float(on_tau[5]) + 3e-6):
            for fallback, lam in (("leftmost", 0.02), ("argmin", 0.02), ("argmin", 0.0)):
                params = SamplingParams(temperature=0.0, wedlm_pos_penalty_factor=lam,
                                        wedlm_entropy_threshold=tau, wedlm_fallback=fallback)
                want, got = both(params, start)
                assert below_tau(got[1], tau) == below_tau(want[1], tau)
                assert argmin(got[1]) == argmin(want[1]) == int(want[1].argmin())
                assert torch.allclose(torch.as_tensor(got[1]), want[1], rtol=1e-5, atol=1e-5)
                calls += 1
                decided += got[0] is None
                assert (got[0] is None) == isinstance(got[1], list)  # the estimate's scores come as a list
                if lam and tau is not None and (want[1] - tau).abs().min() < 1e-5:
                    assert got[0] is not None  # too close to call: the exact path
        tied = SamplingParams(temperature=0.0, wedlm_pos_penalty_factor=0.0, wedlm_entropy_threshold=None)
        assert (both(tied, start)[1][0] is None) == (start < 19)  # windows from 20 hold both equal rows
    assert calls == 147 and decided >= 110  # the estimate decides most windows
    assert estimated.argmax(0, 32) == exact_rows.argmax(0, 32)
