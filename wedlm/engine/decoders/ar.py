"""Plain autoregressive decoding: one token per forward from the AR head; the reference.

The last committed token is always left uncached and fed as the anchor, so
each forward writes its K/V and its logits give the next token. p_cache = 1.
"""

from __future__ import annotations

import torch

from ..request import Sequence
from ..sampling import choose
from .base import Decoder, StepResult, WindowPlan
from .constrain import mask_first_row


class ARDecoder(Decoder):
    name = "ar"
    needs_mask = False
    logprob_rows = "commit"

    def init(self, seq: Sequence) -> None:
        seq.window = []

    def plan(self, seq: Sequence) -> WindowPlan:
        return WindowPlan([], [], [], [], anchor=True)

    def update(self, seq: Sequence, plan: WindowPlan, logits: torch.Tensor,
               argmax: list[int], scores=None) -> StepResult:
        if seq.grammar is not None:  # structured outputs: the grammar's mask on the one new position
            return StepResult(choose(mask_first_row(seq, logits[:1]), seq.params, seq.generator)[0], 0)
        tokens, _ = choose(logits[:1], seq.params, seq.generator, argmax[:1])
        return StepResult(tokens, 0)
