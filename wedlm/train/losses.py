"""WeDLM training losses: weighted mask-recovery cross-entropy + auxiliary AR loss (section 4.2).

What: L = sum_i w_i * CE(logits_i, x_i) / sum_i w_i  (masked prediction slots,
w_i = 1/gamma_k, Eq. 10)  +  ar_weight * mean CE of next-token prediction on the
memory stream. The normalisers (sum of weights, number of AR targets) are passed
in, so that they can be the totals of the GLOBAL batch (all gradient-accumulation
micro-batches on all processes): then the summed gradient equals the gradient of
one big batch, whatever the split (the 2-process test relies on this).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .masking import IGNORE


@dataclass(slots=True)
class LossSums:
    """Un-normalised sums of one micro-batch (scalars, float32)."""

    mask_ce: torch.Tensor  # sum of w_i * CE_i over masked slots
    mask_weight: torch.Tensor  # sum of w_i
    ar_ce: torch.Tensor  # sum of CE over AR targets
    ar_count: torch.Tensor  # number of AR targets


def scored_indices(labels: torch.Tensor) -> torch.Tensor:
    """int64 [n]: flat indices of slots with a label (!= -100)."""
    return torch.nonzero(labels.reshape(-1) != IGNORE).flatten()


def first_end_weights(labels: torch.Tensor, end_id: int, weight: float) -> torch.Tensor:
    """float32 [N, S]: `weight` where the label is `end_id` and the label before it (same row) is
    not, i.e. the first end token after an answer, the AR head's decision to stop; 1 elsewhere.
    Not in the paper: the `end_weight` knob of the stopping experiments (docs/training.md).

    Args:
        labels: int64 [N, S] next-token labels of the memory stream (-100 where unscored).
        end_id: the end token (`<|im_end|>` of chat records).
        weight: the weight of those slots (> 0).
    """
    end = labels == end_id
    before = torch.zeros_like(end)
    before[:, 1:] = end[:, :-1]
    return torch.where(end & ~before, float(weight), 1.0).float()


def loss_sums(logits: torch.Tensor, labels: torch.Tensor, loss_weights: torch.Tensor,
              is_memory: torch.Tensor, ar_weights: torch.Tensor | None = None,
              mask_weights: torch.Tensor | None = None) -> LossSums:
    """Sums of both losses over the scored slots.

    Args:
        logits: float [n, vocab], the logits at the scored slots (same order as `labels[labels != -100]`).
        labels: int64 [N, S] (or flat), -100 where unscored.
        loss_weights: float [N, S], 1/gamma at masked prediction slots (times
            `first_mask_weight` at each block's leftmost mask; 0 elsewhere).
        is_memory: bool [N, S], True on memory-stream slots (their label is the next token).
        ar_weights: float [N, S] or None: per-slot weights of the AR cross-entropy (e.g.
            `first_end_weights`); None = 1 everywhere. The AR normaliser stays the number of
            AR targets, so a weight w counts that slot's loss w times.
        mask_weights: float [N, S] or None: extra per-slot factors of the mask cross-entropy on
            top of `loss_weights` (e.g. `mask_end_weight` on end-token targets); the mask
            normaliser stays the sum of `loss_weights`, so a factor w counts that slot w times.
    """
    flat = labels.reshape(-1) != IGNORE
    target = labels.reshape(-1)[flat]
    ce = F.cross_entropy(logits.float(), target, reduction="none")  # [n]
    mem = is_memory.reshape(-1)[flat]
    w = loss_weights.reshape(-1)[flat].float()
    pred = ~mem
    mask_ce = ce[pred] * w[pred]
    if mask_weights is not None:
        mask_ce = mask_ce * mask_weights.reshape(-1)[flat][pred].float()
    ar_ce = ce[mem] if ar_weights is None else ce[mem] * ar_weights.reshape(-1)[flat][mem].float()
    return LossSums(
        mask_ce=mask_ce.sum(), mask_weight=w[pred].sum(),
        ar_ce=ar_ce.sum(), ar_count=mem.sum().float(),
    )


def combine(sums: LossSums, total_weight: float, total_ar: float, ar_weight: float,
            mix: str = "sum") -> torch.Tensor:
    """Scalar loss of a micro-batch, normalised by GLOBAL totals: mask_ce/W + ar_weight * ar_ce/N.

    `mix="mean"` halves it, (mask + ar_weight * AR) / 2, as the official trainer averages the two.

    Raises:
        ValueError: an unknown `mix`.
    """
    if mix not in ("sum", "mean"):
        raise ValueError(f"loss mix must be 'sum' or 'mean', got {mix!r}")
    loss = sums.ar_ce * (ar_weight / max(total_ar, 1.0))
    if total_weight > 0:
        loss = loss + sums.mask_ce / total_weight
    return loss * 0.5 if mix == "mean" else loss
