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

Stops decided by the AR head (`wedlm_stop_by_ar=True`, this engine's option; off
is Algorithm 1 as published): the leftmost mask, right after the leading filled
run, is filled every step from the AR head's next-token logits instead of its
own mask row. Those logits come free with the same forward: the last slot of the
leading run (or, when the window starts with a mask, the last uncached committed
token) was fed in logical order on committed context only, so its output is
exactly the AR model's next-token distribution for the committed text. And no
other mask may be filled with a stop token: ending the answer is decided only
where the whole text before it is known. A confident false stop in a far slot
cannot be undone (the request ends), while a stop that waits costs at most one
forward. Greedy, the leftmost token of every step is then the one `ar` would
emit after the committed text (docs/method.md, "Stops decided by the AR head").
"""

from __future__ import annotations

import torch

from ..request import Sequence
from ..sampling import RowScores
from .base import Decoder, StepResult, WindowPlan
from .constrain import fill_in_order
from .fill import argmin, below_tau, draw_rows, fill_reach, fill_scores


def plan_filled_first(seq: Sequence, mask_id: int, leftmost_from_ar: bool = False,
                      reach: int | None = None) -> WindowPlan:
    """Reorder seq.window filled-first, then masks, each by ascending position (section 4.1).

    The logits asked for are the masks', in slot order (`row_slots`). Masks more than `reach`
    slots right of the leftmost one (`fill.fill_reach`) are not fed: they stay [MASK] in the
    window, cost no forward rows, and change no other row's logits. With
    `leftmost_from_ar`, slot k (after a leading filled run of k slots: the leftmost mask,
    or, when the whole window is filled, the first slot after it, k = W) takes the AR
    head's row instead of a mask row: the last slot of that run (physical row k - 1, the
    run being fed first and in order), or, when k = 0, the last uncached committed token
    (`anchor`, logits row 0). When k = 0 and every committed token is cached, no AR row
    is fed this forward and the mask row is used.
    """
    base = len(seq.tokens)
    filled = [i for i, t in enumerate(seq.window) if t is not None]
    masks = [i for i, t in enumerate(seq.window) if t is None]
    if reach is not None and masks:  # masks beyond it cannot be filled this step (`fill_reach`)
        masks = [i for i in masks if i - masks[0] <= reach]
    ids = [seq.window[i] for i in filled] + [mask_id] * len(masks)
    positions = [base + i for i in filled + masks]
    rows = list(range(len(filled), len(ids)))
    if leftmost_from_ar and ids:
        k = masks[0] if masks else len(ids)
        if k > 0:
            return WindowPlan(ids, positions, [k - 1] + rows[1:], [k] + masks[1:], leftmost_ar=True)
        if seq.num_cached < len(seq.tokens):
            return WindowPlan(ids, positions, rows[1:], masks[1:], anchor=True, leftmost_ar=True)
    return WindowPlan(ids, positions, rows, masks)


def fill_masks(seq: Sequence, slots: list[int], logits: torch.Tensor, scores: RowScores | None = None,
               ar_first: bool = False) -> None:
    """Fill masks of seq.window by the distance-adjusted entropy rule (Eq. 11, `fill.py`).

    Every mask scoring below tau is filled; when none does, the leftmost (default) or the
    argmin (`wedlm_fallback="argmin"`, and always when tau is None) is.

    Args:
        slots: window indices of the masks, ascending, aligned with `logits` rows.
        logits: float [len(slots), V] predictions at those masks.
        scores: their batch-wide softmax and entropy (`fill.fill_scores`); None = from `logits`.
        ar_first: row 0 is the AR head's prediction for the leftmost mask (stops decided by
            the AR head): the rule above chooses as usual (row 0 scored like a mask row), that
            mask is filled in any case, and no other may take a stop token, unless
            `wedlm_stop_in_run` is set and every mask to its left is filled in this call (rows
            0..j-1 all chosen, none of them a stop), so the stop closes a contiguous run.

    A constrained request (`seq.grammar`, structured outputs) is filled by `constrain.fill_in_order`:
    the same rule, with each mask of the run from the leftmost scored and drawn under the grammar's
    mask after the tokens to its left. An unconstrained one never reaches it.
    """
    if not slots:
        return
    if getattr(seq, "grammar", None) is not None:  # structured outputs (a stand-in may have no grammar)
        fill_in_order(seq, slots, logits, ar_first)
        return
    params = seq.params
    probs, adjusted = fill_scores(logits, params, [s - slots[0] for s in slots], scores)
    tau = params.wedlm_entropy_threshold
    chosen = [j for j, ok in enumerate(below_tau(adjusted, tau)) if ok]
    if not chosen:
        chosen = [0] if tau is not None and params.wedlm_fallback == "leftmost" else [argmin(adjusted)]
    if ar_first and chosen[0] != 0:  # the rule as usual (row 0 scored from the AR row), plus slot 0
        chosen = [0] + chosen
    in_run = ar_first and params.wedlm_stop_in_run
    run = 0  # rows 0..run-1 are filled by this call, none with a stop
    for j, t in zip(chosen, draw_rows(probs, chosen, params, seq.generator, scores)):
        if ar_first and j > 0 and t in seq.stop_ids and not (in_run and run == j):
            continue  # only the AR head (or, with stop_in_run, a stop closing the run) ends the answer
        seq.window[slots[j]] = t
        if run == j and t not in seq.stop_ids:
            run += 1


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
        reach = fill_reach(seq.params) if getattr(seq, "grammar", None) is None else None
        return plan_filled_first(seq, self.mask_token_id, seq.params.wedlm_stop_by_ar, reach)

    def update(self, seq: Sequence, plan: WindowPlan, logits: torch.Tensor,
               argmax: list[int], scores: RowScores | None = None) -> StepResult:
        window = seq.window
        k = leading_filled(window)
        committed = list(window[:k])
        budget = seq.budget_left - k
        if plan.leftmost_ar and k == len(window):  # the AR row is for the first slot after the window
            if budget > 0:
                window.append(None)
                fill_masks(seq, plan.row_slots, logits, scores, ar_first=True)
        else:
            fill_masks(seq, ([k] if plan.anchor else []) + plan.row_slots, logits, scores, ar_first=plan.leftmost_ar)
        rest = seq.window[k:]
        seq.window = rest + [None] * max(0, min(seq.window_size, budget) - len(rest))
        run = seq.window[:leading_filled(seq.window)]
        if run and (len(run) == budget or not seq.stop_ids.isdisjoint(run)):
            committed += run  # the request ends inside this run: commit without another forward
            seq.window = seq.window[len(run):]
        return StepResult(committed, k)
