"""WeDLM Streaming Parallel Decoding (paper section 5.2, Algorithm 1, Eq. 11).

Each step the window (W slots at consecutive logical positions after the
committed text) is fed filled-first, masks after, with logical position ids.
Then:

1. the leftmost contiguous run of filled slots is committed: those slots were
   fed in logical order on committed context only, so their K/V rows are
   valid as written (no recompute);
2. every remaining mask gets entropy H_i of its prediction, adjusted
   H~_i = H_i + lambda * d_i with d_i its distance in slots from the leftmost
   remaining mask; masks with H~_i < tau are filled (sampled with the
   request's temperature/top-k/top-p; [MASK] itself is never a fill);
3. if none passes tau, one mask is filled: the LEFTMOST by default (so the
   next forward always commits at least one token), or the argmin of H~ (the
   official rule, `wedlm_fallback="argmin"`), which can pick a far slot and
   commit nothing next step. tau = None fills only the argmin each step;
4. the window slides: new masks are appended for the committed slots, bounded
   by the request's remaining budget.

When the leftmost filled run after a fill already ends the request (it holds
a stop token or reaches the length limit), it is committed at once: its cache
rows are never needed, so the extra forward is skipped.
"""

from __future__ import annotations

import torch

from ..request import Sequence
from ..sampling import RowScores
from .base import Decoder, StepResult, WindowPlan
from .fill import below_tau, draw, fill_scores


def plan_filled_first(seq: Sequence, mask_id: int) -> WindowPlan:
    """Reorder seq.window filled-first, then masks, each by ascending position (section 4.1).

    The logits asked for are the masks', in slot order (`row_slots`).
    """
    base = len(seq.tokens)
    filled = [i for i, t in enumerate(seq.window) if t is not None]
    masks = [i for i, t in enumerate(seq.window) if t is None]
    ids = [seq.window[i] for i in filled] + [mask_id] * len(masks)
    return WindowPlan(ids, [base + i for i in filled + masks], list(range(len(filled), len(ids))), masks)


def fill_masks(seq: Sequence, slots: list[int], logits: torch.Tensor, scores: RowScores | None = None) -> None:
    """Fill masks of seq.window by the distance-adjusted entropy rule (Eq. 11, `fill.py`).

    Every mask scoring below tau is filled; when none does, the leftmost (default) or the
    argmin (`wedlm_fallback="argmin"`, and always when tau is None) is.

    Args:
        slots: window indices of the masks, ascending, aligned with `logits` rows.
        logits: float [len(slots), V] predictions at those masks.
        scores: their batch-wide softmax and entropy (`fill.fill_scores`); None = from `logits`.
    """
    if not slots:
        return
    params = seq.params
    probs, adjusted = fill_scores(logits, params, [s - slots[0] for s in slots], scores)
    tau = params.wedlm_entropy_threshold
    chosen = [j for j, ok in enumerate(below_tau(adjusted, tau)) if ok]
    if not chosen:
        chosen = [0] if tau is not None and params.wedlm_fallback == "leftmost" else [int(adjusted.argmin())]
    for j, t in zip(chosen, draw(probs[chosen], params, seq.generator)):
        seq.window[slots[j]] = t


def leading_filled(window: list[int | None]) -> int:
    n = 0
    while n < len(window) and window[n] is not None:
        n += 1
    return n


class StreamingDecoder(Decoder):
    """`decoding="wedlm"`."""

    name = "wedlm"

    def init(self, seq: Sequence) -> None:
        seq.window = [None] * min(seq.window_size, seq.budget_left)

    def plan(self, seq: Sequence) -> WindowPlan:
        return plan_filled_first(seq, self.mask_token_id)

    def update(self, seq: Sequence, plan: WindowPlan, logits: torch.Tensor,
               argmax: list[int], scores: RowScores | None = None) -> StepResult:
        window = seq.window
        k = leading_filled(window)
        committed = list(window[:k])
        fill_masks(seq, plan.row_slots, logits, scores)
        budget = seq.budget_left - k
        rest = seq.window[k:]
        seq.window = rest + [None] * max(0, min(seq.window_size, budget) - len(rest))
        run = seq.window[:leading_filled(seq.window)]
        if run and (len(run) == budget or not seq.stop_ids.isdisjoint(run)):
            committed += run  # the request ends inside this run: commit without another forward
            seq.window = seq.window[len(run):]
        return StepResult(committed, k)
