"""Structured outputs inside the decoders: grammar masks and checks of filled runs (`structured.py`).

A constrained sequence carries `seq.grammar`, its matcher advanced along the committed output.
The decoders call these helpers only for such sequences; an unconstrained one never reaches them.

* `ar` masks the one new position's logits.
* `wedlm` / `blockwise` (`fill_in_order`): the window is walked left to right from the leftmost
  mask on a lookahead of the matcher (advanced through the leading filled run, rolled back
  after). Each mask's row is masked to what the grammar allows after every token to its left
  before the fill rule scores it, so a token the grammar forces (JSON punctuation, a key, the
  rest of a choice) has entropy 0 and is filled in the same step. The walk stops at the first
  slot left [MASK], and the masks right of it wait for a later walk. The leading filled run,
  the only part ever committed, is therefore always a valid continuation, and a stop token in
  it was accepted only where the grammar may end.
* `verified`: the AR rows that judge the drafts are masked along the drafts (`verify_rows`), so
  the greedy answer is constrained `ar`'s token for token, and a draft the grammar rejects has
  target probability 0 and is always rejected (the residual keeps sampling exact). Tokens the
  grammar forces after the drafts become drafts too (`with_forced`), drawn from a one-hot q:
  the masked target is the same one-hot, so they are always accepted and sampling stays exact.
"""

from __future__ import annotations

import torch

from ..request import Sequence
from ..sampling import probabilities
from ..structured import Lookahead
from .fill import below_tau, draw, fill_scores


def mask_first_row(seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
    """A copy of logits [n, V] with row 0 (the next token after the committed output: `ar`'s
    only row) masked to the tokens the grammar allows there."""
    out = logits.clone()
    out[0] = seq.grammar.mask_logits(logits[0], [])
    return out


def fill_in_order(seq: Sequence, slots: list[int], logits: torch.Tensor, ar_first: bool = False) -> None:
    """Fill the masks of a constrained seq.window by the entropy rule (paper section 5.2, Eq. 11,
    Algorithm 1 step 2), each slot scored under the grammar's mask after every token to its left.

    Walks the window from the leftmost mask (`_walk`): the matcher is advanced (ahead of the
    commit, rolled back after) through the window's leading filled run, then slot by slot. A
    mask's row gets the grammar's mask BEFORE its entropy is scored and its token drawn, so a
    token the grammar forces (JSON punctuation, a key) has entropy 0, and text the grammar
    forces is filled at any distance, in xgrammar's tokenization of it. The walk stops at the
    first slot left [MASK]: a token right of an unknown one cannot be checked, so the masks
    right of it stay [MASK] and are decided by a later walk, under the grammar, from that
    forward's rows (a fill there would mostly be rejected once its left is known, and a
    rejected slot has no row in that forward to refill it from). The leftmost mask is always
    filled (the fallback of the rule, or the AR head's row): the only mask the grammar can check.

    Args:
        slots: window indices of the masks, ascending, aligned with `logits` rows.
        logits: float [len(slots), V] predictions at those masks; not modified.
        ar_first: row 0 is the AR head's row for the leftmost mask (`streaming.fill_masks`).
    """
    with seq.grammar.lookahead() as look:
        for token in seq.window[:slots[0]]:  # the leading run: accepted when it was filled
            if not look.accept(token):
                raise ValueError(f"token {token} of the window's leading run breaks the grammar")
        stop, ended = _walk(seq, look, slots, logits, ar_first)
    if ended:  # after the stop token: never committed, filled so that a block-wise window completes
        rest = [j for j, s in enumerate(slots) if s >= stop]
        tokens = draw(probabilities(logits[rest], seq.params), seq.params, seq.generator) if rest else []
        for j, t in zip(rest, tokens):
            seq.window[slots[j]] = t


def _walk(seq: Sequence, look: Lookahead, slots: list[int], logits: torch.Tensor,
          ar_first: bool) -> tuple[int, bool]:
    """Decide the window's slots left to right from the leftmost mask under the grammar.

    Returns:
        (the window slot where the walk stopped: a slot left [MASK], the first slot after a stop
         token the grammar accepted, or len(window); whether it stopped after a stop token).
    """
    window, rows, first = seq.window, {s: j for j, s in enumerate(slots)}, slots[0]
    for i in range(first, len(window)):
        if look.ended:
            return i, True
        if window[i] is not None:  # a fill right of a mask (none is left by a walk): checked now
            if look.accept(window[i]):
                continue
            window[i] = None
            return i, False
        if i not in rows:
            return i, False
        token = _decide(seq, look, logits[rows[i]], i - first, ar_first)
        if token is None or not look.accept(token):  # drawn under the grammar's mask: accepted
            return i, False
        window[i] = token
    return len(window), False


def _decide(seq: Sequence, look: Lookahead, logits: torch.Tensor, distance: int, ar_first: bool) -> int | None:
    """The token for the mask `distance` slots right of the leftmost (logits float [V], its row),
    or None to leave it [MASK].

    Filled at any distance with the token the grammar forces, when it forces the text that
    follows (`Lookahead.forced_token`), allows a single token (entropy 0), or allows only stop
    tokens (the answer must end here): the prediction cannot change the text. Otherwise drawn
    under the grammar's mask when its constrained score H + lambda * d passes tau, and always
    at distance 0. A stop token right of the leftmost mask under `ar_first` needs
    `wedlm_stop_in_run` or the grammar forcing the end (every slot to its left is decided
    either way). The forced text is looked up only for a slot the rule would leave [MASK].
    """
    params = seq.params
    row = look.mask_row(logits)
    probs, ent = fill_scores(row[None], params, [0])
    ent = float(ent[0])
    score = torch.tensor([ent + params.wedlm_pos_penalty_factor * distance])  # Eq. 11 at its distance
    if not (ent == 0.0 or distance == 0 or below_tau(score, params.wedlm_entropy_threshold)[0]):
        forced = look.forced_token()
        if forced is not None:
            return forced
        if not _only_stops(row, seq.stop_ids):
            return None
    token = draw(probs, params, seq.generator)[0]
    if ar_first and distance > 0 and token in seq.stop_ids and not (
            params.wedlm_stop_in_run or _only_stops(row, seq.stop_ids)):
        return None
    return token


def _only_stops(row: torch.Tensor, stop_ids: frozenset[int]) -> bool:
    """Whether every finite entry of a masked row float [V] is a stop token."""
    ids = [t for t in stop_ids if t < row.shape[0]]
    finite = row.isfinite()
    return bool(ids) and int(finite[ids].sum()) == int(finite.sum())


def verify_rows(seq: Sequence, drafts: list[int], targets: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The AR rows targets [m + 1, V] masked along the drafts.

    Returns (n, rows [n + 1, V]): n = how many leading drafts the grammar accepts; row j is
    masked to what the grammar allows after the committed output and drafts[:j].
    """
    n = seq.grammar.valid_prefix(drafts)
    rows = torch.stack([seq.grammar.mask_logits(targets[j], drafts[:j]) for j in range(n + 1)])
    return n, rows


def with_forced(seq: Sequence, committed: list[int], drafts: list[int], q: torch.Tensor | None, limit: int,
                logits: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
    """`drafts` (after the tokens `committed` this step) extended by the tokens the grammar forces
    after them, at most `limit` drafts in all, when the grammar accepts every draft.

    Returns the drafts and their q rows [n, V] (one-hot rows for the forced ones, on the device
    of `logits` [*, V]; None when greedy).
    """
    run = list(committed) + list(drafts)
    if seq.grammar.valid_prefix(run) < len(run):
        return drafts, q
    forced: list[int] = []
    while len(drafts) + len(forced) < limit:
        token = seq.grammar.forced(run + forced)
        if token is None:
            break
        forced.append(token)
    if not forced:
        return drafts, q
    if not seq.params.greedy:
        one_hot = torch.zeros(len(forced), logits.shape[-1], device=logits.device)
        one_hot[torch.arange(len(forced)), torch.tensor(forced)] = 1.0
        q = one_hot if q is None else torch.cat([q, one_hot.to(q.dtype)])
    return list(drafts) + forced, q
