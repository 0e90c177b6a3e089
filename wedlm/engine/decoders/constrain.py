"""Structured outputs inside the decoders: grammar masks and checks of filled runs (`structured.py`).

A constrained sequence carries `seq.grammar`, its matcher advanced along the committed output.
The decoders call these helpers only for such sequences; an unconstrained one never reaches them.

* `ar` masks the one new position's logits.
* `wedlm` / `blockwise` (`fill_masks`): the leftmost mask follows the window's leading filled run
  (valid, see below), so its exact next-token mask is known: its row is masked before the fill
  rule scores it. Masks further right would need every slot before them known, so their fills
  are candidates: after each fill, the leading filled run is checked by accepting it on the
  matcher and rolling back, and the first token the grammar rejects goes back to [MASK]. The
  leading run, the only part ever committed, is therefore always a valid continuation, and a stop
  token in it was accepted only where the grammar may end. A mask right after the run whose
  token the grammar forces (JSON punctuation, a key, the rest of a choice) is filled with it in
  the same step, so forced text costs no forward of its own.
* `verified`: the AR rows that judge the drafts are masked along the drafts (`verify_rows`), so
  the greedy answer is constrained `ar`'s token for token, and a draft the grammar rejects has
  target probability 0 and is always rejected (the residual keeps sampling exact). Tokens the
  grammar forces after the drafts become drafts too (`with_forced`), drawn from a one-hot q:
  the masked target is the same one-hot, so they are always accepted and sampling stays exact.
"""

from __future__ import annotations

import torch

from ..request import Sequence


def mask_leftmost(seq: Sequence, slots: list[int], logits: torch.Tensor) -> torch.Tensor:
    """A copy of logits [n, V] (row 0 = the leftmost mask, window slot `slots[0]`) with row 0
    masked to the tokens the grammar allows after the committed output and window[:slots[0]]."""
    run = seq.window[:slots[0]]
    out = logits.clone()
    out[0] = seq.grammar.mask_logits(logits[0], run)
    return out


def settle_window(seq: Sequence) -> None:
    """After a fill: put [MASK] back at the first slot of the leading filled run the grammar
    rejects, then fill every mask right after the run whose token the grammar forces (the one
    token it allows: what sampling under its mask would draw), checking again past each."""
    window = seq.window
    while True:
        n = _leading(window)
        valid = seq.grammar.valid_prefix(window[:n])
        if valid < n:
            window[valid] = None
            n = valid
        if n == len(window):
            return
        forced = seq.grammar.forced(window[:n])
        if forced is None:
            return
        window[n] = forced


def _leading(window: list[int | None]) -> int:
    n = 0
    while n < len(window) and window[n] is not None:
        n += 1
    return n


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
