"""Lossless verified decoding: WeDLM mask predictions as drafts, the AR head as verifier.

The window is [drafts d_0..d_{m-1}, then masks] at consecutive positions after
the committed text, and the last committed token (the anchor) is fed uncached
in front of it, so the fed order is plain logical order. One forward gives

* the AR next-token logits at the anchor and at each draft: targets for
  positions n, n+1, ..., n+m (n = number of committed tokens);
* mask logits at positions n+m.. (predictions AT their positions).

Verification is speculative decoding's rule. Greedy: accept drafts while they
equal the AR argmax, then commit the AR argmax at the first mismatch (the
correction) or after the last draft (the bonus): at least one token per
forward, and exactly the tokens greedy AR decoding would produce
(docs/invariants.md, "Verified equals AR"). Sampling: accept d_i with probability
min(1, p_i(d_i) / q_i(d_i)); on rejection draw from norm(max(0, p_i - q_i)); if
all are accepted draw the bonus from p_m. p is the request's processed AR
distribution, q the distribution the draft was drawn from, so outputs are
distributed exactly as AR sampling.

The accepted drafts were fed in logical order on committed context, so their
cache rows are valid; the correction/bonus token becomes the next anchor. When
every draft was accepted, the masks after the bonus position saw only correct
context and become the next drafts: the contiguous run whose entropy is below tau (always
at least one), at most W-1 of them. The drafts take no distance penalty (lambda): `wedlm`'s
penalty keeps its irreversible fills close to the committed text, while a wrong draft here
is only rejected, and the run already ends at the first unconfident mask (under the shipped
model's tau 0.15 and lambda 0.015 a penalised run could never pass 10 slots).

Structured outputs (`constrain.py`): the AR rows are masked by the grammar along the drafts
before verification, so constrained greedy `verified` equals constrained greedy `ar`.

Under load the window shrinks (`window_for_load`): a forward of many requests is compute
bound, where each row of a window costs about as much as a whole AR token, so
the engine trims the window of every greedy verified request of a step to what the token
budget leaves per request (`fit_window`). Trimming keeps the leading drafts and masks, all at
consecutive positions after the committed text, so the rule above still commits exactly AR's
tokens; a window trimmed to nothing is a plain AR step (the anchor alone). Sampled requests keep
their whole window, so that a seeded request's draws never depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..request import Sequence
from ..sampling import RowScores, probabilities, sample
from .base import Decoder, StepResult, WindowPlan
from .constrain import verify_rows, with_forced
from .fill import below_tau, draw_rows, fill_scores


@dataclass
class DraftState:
    """q distributions [m, V] the current drafts were sampled from (None when greedy)."""

    q: torch.Tensor | None = None


def window_for_load(window_size: int, requests: int, budget: int) -> int:
    """Window slots of each verified request when `requests` requests decode in one forward.

    A whole verified window is its drafts (at most W - 1) and W masks after them, so at most
    2W - 1 slots, and a request feeds its anchor plus its window. The rule: each request gets
    the rows the budget leaves it, budget // requests - 1 slots, capped at the whole window,
    and below 2 slots none at all: one slot is a mask at the position the anchor already
    predicts, so it could never yield a draft, and 0 is a plain AR step. E.g. W = 16, budget
    128 (the default): whole windows (31 slots) up to 4 requests, 17 slots at 7, 15 at 8, 7 at
    16, 3 at 32, none from 43 requests on.

    Args:
        window_size: the request's W (>= 1).
        requests: requests with a window in the forward (>= 1).
        budget: the engine's `verified_token_budget` (>= 1).

    Returns:
        slots in 0..2 * window_size - 1.
    """
    slots = min(2 * window_size - 1, budget // requests - 1)
    return slots if slots >= 2 else 0


class VerifiedDecoder(Decoder):
    """`decoding="verified"`."""

    name = "verified"
    logprob_rows = "commit"  # committed tokens are the AR head's choices (rows 0..accepted)

    def row_offsets(self, seq: Sequence, plan: WindowPlan) -> list[int]:
        """The anchor predicts offset 0, draft slot i (an AR row) offset i + 1, mask slot i offset i."""
        return [0] + [i + 1 if seq.window[i] is not None else i for i in plan.row_slots]

    def fit_window(self, seq: Sequence, slots: int) -> None:
        """Trim a greedy request's window to its first `slots` slots (drafts come first, then
        masks). A sampled request keeps its whole window: its random draws follow its window, and
        a seeded request's tokens must not depend on what else is in the batch."""
        if len(seq.window) <= slots or not seq.params.greedy:
            return
        seq.window = seq.window[:slots]

    def init(self, seq: Sequence) -> None:
        seq.window = [None] * min(seq.window_size, seq.budget_left)
        seq.decoder_state = DraftState()

    def plan(self, seq: Sequence) -> WindowPlan:
        base = len(seq.tokens)
        ids = [self.mask_token_id if t is None else t for t in seq.window]
        slots = list(range(len(ids)))
        return WindowPlan(ids, list(range(base, base + len(ids))), slots, slots, anchor=True)

    def update(self, seq: Sequence, plan: WindowPlan, logits: torch.Tensor,
               argmax: list[int], scores: RowScores | None = None) -> StepResult:
        drafts = [t for t in seq.window if t is not None]
        m = len(drafts)
        targets = logits[: m + 1]  # AR heads of the anchor and the drafts
        if seq.grammar is not None:
            accepted, last = _verify_constrained(drafts, targets, seq)
        elif seq.params.greedy:
            accepted, last = _verify_greedy(drafts, argmax[: m + 1])
        else:
            accepted, last = _verify_sampled(drafts, targets, seq)
        committed = drafts[:accepted] + [last]
        budget = seq.budget_left - len(committed)
        new_drafts, q = [], None
        if accepted == m:  # masks after the bonus position saw only correct context
            new_drafts, q = self._draft(seq, logits[m + 2:], min(seq.window_size - 1, budget),
                                        len(seq.tokens) + len(committed),
                                        scores=None if scores is None else scores[m + 2:])
        if seq.grammar is not None:  # structured outputs: tokens the grammar forces are drafts too
            new_drafts, q = with_forced(seq, committed, new_drafts, q, min(seq.window_size - 1, budget), logits)
        n_masks = min(seq.window_size, budget - len(new_drafts))
        seq.window = list(new_drafts) + [None] * max(0, n_masks)
        seq.decoder_state = DraftState(q)
        return StepResult(committed, accepted)

    def _draft(self, seq: Sequence, logits: torch.Tensor, limit: int, first_position: int,
               scores: RowScores | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Drafts for positions first_position.. from mask logits [k, V] there: the confident leading run.

        Returns at most `limit` draft ids and the q rows [n, V] they were sampled
        from (None when greedy); always at least one draft when any is allowed.
        """
        if limit <= 0 or logits.shape[0] == 0:
            return [], None
        logits = logits[:limit]
        params = seq.params
        scores = None if scores is None else scores[:limit]
        probs, entropy = fill_scores(logits, params, [0] * logits.shape[0], scores)  # no distance penalty
        passing = below_tau(entropy, params.wedlm_entropy_threshold)
        n = 1
        while n < len(passing) and passing[n]:
            n += 1
        drafts = draw_rows(probs, list(range(n)), params, seq.generator, scores)
        return drafts, None if params.greedy else probs[:n].clone()


def _verify_greedy(drafts: list[int], target_ids: list[int]) -> tuple[int, int]:
    """(number of drafts accepted, the correction or bonus token)."""
    j = 0
    while j < len(drafts) and drafts[j] == target_ids[j]:
        j += 1
    return j, target_ids[j]


def _verify_constrained(drafts: list[int], targets: torch.Tensor, seq: Sequence) -> tuple[int, int]:
    """The greedy or sampled rule on the AR rows masked by the grammar (structured outputs).

    Only the n drafts the grammar accepts can be accepted. Greedy: the rule on drafts[:n] and the
    masked argmax (a rejected draft n is never the masked argmax). Sampling: draft n, when there
    is one, stays in so that its rejection (target probability 0) draws from the residual; the
    row after it is never read and repeats row n.
    """
    n, rows = verify_rows(seq, drafts, targets)
    if seq.params.greedy:
        return _verify_greedy(drafts[:n], rows.argmax(-1).tolist())
    if n < len(drafts):
        return _verify_sampled(drafts[:n + 1], torch.cat([rows, rows[-1:]]), seq)
    return _verify_sampled(drafts, rows, seq)


def _verify_sampled(drafts: list[int], target_logits: torch.Tensor, seq: Sequence) -> tuple[int, int]:
    """Speculative sampling (accept with min(1, p/q), else resample from the residual)."""
    p = probabilities(target_logits, seq.params)  # [m + 1, V]
    q = seq.decoder_state.q if drafts else None
    gen = seq.generator
    for j, d in enumerate(drafts):
        u = torch.rand((), generator=gen, device=p.device)
        if p[j, d] > 0 and u * q[j, d] <= p[j, d]:  # p = 0: never accepted, even when u = 0
            continue
        residual = (p[j] - q[j]).clamp_min(0)
        if residual.sum() <= 0:
            residual = p[j]
        return j, int(sample((residual / residual.sum())[None], gen)[0])
    return len(drafts), int(sample(p[len(drafts):len(drafts) + 1], gen)[0])
