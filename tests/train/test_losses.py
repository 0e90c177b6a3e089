"""Losses: 1/gamma-weighted mask recovery normalised by the global weight sum (Eq. 10) + AR loss."""

import torch
import torch.nn.functional as F

from wedlm.train.losses import combine, loss_sums


def test_weighted_mask_loss_and_ar_loss():
    torch.manual_seed(0)
    labels = torch.tensor([[5, -100, 7, 2, -100, 3]])
    is_memory = torch.tensor([[True, True, True, False, False, False]])
    weights = torch.tensor([[0.0, 0.0, 0.0, 2.0, 0.0, 4.0]])  # 1/gamma = 2 and 4
    logits = torch.randn(4, 10)  # scored slots in order: 5, 7 (memory), 2, 3 (masks)
    s = loss_sums(logits, labels, weights, is_memory)
    ce = F.cross_entropy(logits, torch.tensor([5, 7, 2, 3]), reduction="none")
    assert torch.isclose(s.mask_ce, 2 * ce[2] + 4 * ce[3]) and float(s.mask_weight) == 6.0
    assert torch.isclose(s.ar_ce, ce[0] + ce[1]) and float(s.ar_count) == 2
    loss = combine(s, float(s.mask_weight), float(s.ar_count), ar_weight=0.5)
    expected = (2 * ce[2] + 4 * ce[3]) / 6 + 0.5 * (ce[0] + ce[1]) / 2
    assert torch.isclose(loss, expected)


def test_global_normalisation_makes_split_batches_sum_to_whole():
    """Two halves normalised by the global totals add up to the loss of the whole batch."""
    torch.manual_seed(1)
    labels = torch.tensor([[1, 2, -100, 4], [3, -100, 1, 2]])
    is_memory = torch.tensor([[True, True, False, False]] * 2)
    weights = torch.tensor([[0, 0, 0, 1.5], [0, 0, 3.0, 1.25]])
    logits = torch.randn(int((labels != -100).sum()), 6)
    whole = loss_sums(logits, labels, weights, is_memory)
    n0 = int((labels[0] != -100).sum())
    a = loss_sums(logits[:n0], labels[:1], weights[:1], is_memory[:1])
    b = loss_sums(logits[n0:], labels[1:], weights[1:], is_memory[1:])
    tw, ta = float(whole.mask_weight), float(whole.ar_count)
    assert torch.isclose(combine(a, tw, ta, 1.0) + combine(b, tw, ta, 1.0), combine(whole, tw, ta, 1.0))


def test_mean_mix_halves_the_sum_and_unknown_mix_is_refused():
    """loss_mix="mean" is the official (mask + AR) / 2; anything else is a ValueError naming it."""
    import pytest

    torch.manual_seed(2)
    labels = torch.tensor([[4, 1, -100, 2]])
    is_memory = torch.tensor([[True, True, False, False]])
    weights = torch.tensor([[0.0, 0.0, 0.0, 3.0]])
    s = loss_sums(torch.randn(3, 8), labels, weights, is_memory)
    total = combine(s, 3.0, 2.0, 1.0)
    assert torch.isclose(combine(s, 3.0, 2.0, 1.0, "mean"), total / 2)
    with pytest.raises(ValueError, match="mix"):
        combine(s, 3.0, 2.0, 1.0, "avg")


def test_first_end_weight_counts_the_stop_decision_w_times():
    from wedlm.train.losses import first_end_weights

    end = 9
    labels = torch.tensor([[5, 7, end, end, end, -100], [end, 4, end, -100, 6, end]])
    w = first_end_weights(labels, end, 10.0)
    assert w.tolist() == [[1, 1, 10, 1, 1, 1], [10, 1, 10, 1, 1, 10]]
    is_memory = torch.ones_like(labels, dtype=torch.bool)
    n = int((labels != -100).sum())
    logits = torch.randn(n, 10, generator=torch.Generator().manual_seed(3))
    plain = loss_sums(logits, labels, torch.zeros(2, 6), is_memory)
    weighted = loss_sums(logits, labels, torch.zeros(2, 6), is_memory, w)
    ce = F.cross_entropy(logits, labels[labels != -100], reduction="none")
    first = w[labels != -100] == 10
    assert torch.isclose(weighted.ar_ce, plain.ar_ce + 9 * ce[first].sum())
    assert float(weighted.ar_count) == float(plain.ar_count) == n  # the normaliser stays the count


def test_mask_weights_count_end_targets_w_times_and_keep_the_normaliser():
    end = 9
    labels = torch.tensor([[3, end, end, 4, -100, end]])
    is_memory = torch.tensor([[True, True, False, False, False, False]])
    loss_weights = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0, 4.0]])
    factors = torch.where((labels == end) & ~is_memory, 5.0, 1.0)
    n = int((labels != -100).sum())
    logits = torch.randn(n, 10, generator=torch.Generator().manual_seed(4))
    plain = loss_sums(logits, labels, loss_weights, is_memory)
    weighted = loss_sums(logits, labels, loss_weights, is_memory, mask_weights=factors)
    ce = F.cross_entropy(logits, labels[labels != -100], reduction="none")  # slots 0, 1, 2, 3, 5
    assert torch.isclose(weighted.mask_ce, plain.mask_ce + 4 * (2.0 * ce[2] + 4.0 * ce[4]))
    assert float(weighted.mask_weight) == float(plain.mask_weight) == 8.0
    assert torch.equal(weighted.ar_ce, plain.ar_ce)  # the memory stream's end target is untouched
