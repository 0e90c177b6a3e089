"""The decoder interface: each decoding strategy is a small pluggable object.

A decoder owns the window of a sequence (`seq.window`, slot i at logical
position len(seq.tokens) + i) and two operations:

* `plan(seq) -> WindowPlan`: the window slots to feed after the uncached
  committed tokens, in physical order, with their logical positions and the
  rows whose logits it needs and the window slot each of those rows belongs
  to; `anchor=True` also asks for the logits of the last committed token (the
  AR next-token head).
* `update(seq, plan, logits, argmax) -> StepResult`: read those logits (row j
  of the window part is window slot `plan.row_slots[j]`),
  decide which tokens are committed and how many of them already have valid
  cache rows, and set the window for the next forward.

Decoders hold no per-request state of their own (it lives on the Sequence),
so one instance serves every request. AR decoding is the reference the
others are tested against (docs/invariants.md). No decoder needs to ban
[MASK]: the runner sets its logit column to -inf before any decoder reads it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..request import Sequence
from ..sampling import RowScores


@dataclass
class WindowPlan:
    """What a decoder feeds in the next forward.

    Attributes:
        token_ids: window slots in physical order ([MASK] id for masks).
        positions: logical position of each slot.
        logit_rows: indices into `token_ids` whose logits are needed, in order.
        row_slots: the window index (`seq.window`) of each of those rows.
        anchor: also return the logits of the last committed token, as row 0.
        leftmost_ar: the first logits row (the anchor's, or else `logit_rows[0]`) is the AR
            head's next-token row for the leftmost mask (`wedlm_stop_by_ar`,
            decoders/streaming.py).
    """

    token_ids: list[int]
    positions: list[int]
    logit_rows: list[int]
    row_slots: list[int]
    anchor: bool = False
    leftmost_ar: bool = False


@dataclass
class StepResult:
    """What a decoder decided after a forward.

    Attributes:
        committed: tokens to append to the sequence, in logical order.
        num_valid: how many leading committed tokens already have valid K/V
            rows (they were fed this forward in logical order on committed
            context only, paper section 5.2 step 3); the rest are fed next time.
    """

    committed: list[int]
    num_valid: int = 0


class Decoder(ABC):
    """Base class of decoding strategies.

    Args:
        mask_token_id: the [MASK] id (None for plain AR checkpoints; only `ar`
            and decoders with `needs_mask = False` then work).
    """

    name = "base"
    needs_mask = True
    # Which row gives a committed token's logprob (`logprobs.py`): "fill", the row that filled
    # its slot (whenever that was); "commit", row j of the committing forward for the j-th
    # committed token (the AR head's rows: `ar`, `verified`).
    logprob_rows = "fill"

    def __init__(self, mask_token_id: int | None) -> None:
        self.mask_token_id = mask_token_id

    @abstractmethod
    def init(self, seq: Sequence) -> None:
        """Set the window for the first forward (which also carries the prompt)."""

    def fit_window(self, seq: Sequence, slots: int) -> None:
        """Shrink the window to at most `slots` slots before `plan` when the forward is loaded
        (`decoders/verified.py`, `window_for_load`); the others keep their window."""
        return None

    @abstractmethod
    def plan(self, seq: Sequence) -> WindowPlan:
        """The window to feed next."""

    def row_offsets(self, seq: Sequence, plan: WindowPlan) -> list[int]:
        """For each logits row of `plan` (anchor first), the window offset of the token it predicts
        (0 = the token right after the committed text), read before `update`. The logit controls
        count the fills to the left of that offset (`logits_processors.py`)."""
        return ([0] if plan.anchor else []) + list(plan.row_slots)

    @abstractmethod
    def update(self, seq: Sequence, plan: WindowPlan, logits: torch.Tensor,
               argmax: list[int], scores: RowScores | None = None) -> StepResult:
        """Consume logits float [len(plan.logit_rows) + plan.anchor, V] (anchor row first) and
        their argmax ids; `plan` is what `plan(seq)` returned for this forward. `scores`: the
        same rows' softmax and entropy computed batch-wide (None = compute from `logits`)."""
