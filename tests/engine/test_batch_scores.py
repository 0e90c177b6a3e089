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
