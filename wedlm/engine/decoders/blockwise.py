"""Block-wise (stop-and-wait) decoding: the baseline of the paper's Fig. 3 and Fig. 4c.

A block of W masks at the next W positions is filled by the same entropy rule
as Streaming Parallel Decoding, but nothing is committed until the whole block
is filled; then the block is committed at once and the next block starts.
Filled slots of an unfinished block are re-fed (recomputed) every step, and the
committed block is fed once more as context with the next block's masks, which
is what makes p_cache and tokens/forward lower than streaming (section 5.1).
"""

from __future__ import annotations

import torch

from ..request import Sequence
from ..sampling import RowScores
from .base import StepResult, WindowPlan
from .streaming import StreamingDecoder, fill_masks, plan_filled_first


class BlockwiseDecoder(StreamingDecoder):
    """`decoding="blockwise"`: the streaming window and fill rule, committed a whole block at a time
    (mask rows only: `wedlm_stop_by_ar` is a streaming option)."""

    name = "blockwise"

    def plan(self, seq: Sequence) -> WindowPlan:
        return plan_filled_first(seq, self.mask_token_id)

    def update(self, seq: Sequence, plan: WindowPlan, logits: torch.Tensor,
               argmax: list[int], scores: RowScores | None = None) -> StepResult:
        fill_masks(seq, plan.row_slots, logits, scores)
        if any(t is None for t in seq.window):
            return StepResult([], 0)
        block = list(seq.window)
        seq.window = [None] * min(seq.window_size, seq.budget_left - len(block))
        return StepResult(block, 0)  # fed as context (recomputed) with the next block
