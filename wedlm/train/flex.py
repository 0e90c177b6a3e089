"""FlexAttention fast path for dual-stream training (GPU; runs unfused but correct on CPU).

What: `FlexDualStreamAttention` evaluates the visibility rules of
docs/method.md ("Training") as a FlexAttention `mask_mod` from per-slot metadata
(stream, document, block, logical position, physical index), and
`create_block_mask` turns that into a block-sparse mask whose fully hidden
tiles are skipped by the fused kernel (compiled with `torch.compile`).

Why from the rules and not from the dense tensor: the point of the fast path is
to never materialise a [2L, 2L] mask; the test checks that its logits equal the
dense reference (`DenseAttention` with the mask from masking.py).

The metadata is recovered from `position_ids` alone: documents start where the
memory stream's position is 0, blocks are (document, position // B), and a
prediction slot lies in the same row range (same document and block) as the
memory slot with the same index, because reordering only permutes inside a block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wedlm.model.attention import DenseAttention


def slot_metadata(position_ids: torch.Tensor, stream_len: int, block_size: int) -> dict[str, torch.Tensor]:
    """Per-slot int64 [N, S] tensors: stream (0 memory, 1 prediction), doc, block, pos."""
    mem_pos = position_ids[:, :stream_len]
    doc = (mem_pos == 0).long().cumsum(1)  # [N, L]
    block = doc * (stream_len + 1) + mem_pos // block_size  # unique per (document, block)
    n_streams = position_ids.shape[1] // stream_len
    stream = torch.arange(n_streams, device=position_ids.device).repeat_interleave(stream_len)
    return {"stream": stream.expand_as(position_ids).contiguous(), "doc": doc.repeat(1, n_streams),
            "block": block.repeat(1, n_streams), "pos": position_ids}


def dual_stream_mask_mod(meta: dict[str, torch.Tensor], block_size: int):
    """mask_mod(b, h, q, k) -> bool, True where q may see k (the section-3 rules)."""
    stream, doc, block, pos = meta["stream"], meta["doc"], meta["block"], meta["pos"]

    def mask_mod(b, h, q, k):
        same_doc = doc[b, q] == doc[b, k]
        q_mem, k_mem = stream[b, q] == 0, stream[b, k] == 0
        mem_mem = q_mem & k_mem & (pos[b, k] <= pos[b, q])
        pred_mem = ~q_mem & k_mem & (pos[b, k] < (pos[b, q] // block_size) * block_size)
        pred_pred = ~q_mem & ~k_mem & (block[b, q] == block[b, k]) & (k <= q)
        return same_doc & (mem_mem | pred_mem | pred_pred)
    return mask_mod


@dataclass
class FlexDualStreamAttention(DenseAttention):
    """Same contract as `DenseAttention` (`mask` stays None); attention via FlexAttention.

    Attributes:
        block_mask: the FlexAttention BlockMask of the batch.
        compiled: use `torch.compile(flex_attention)` (the fused kernel; GPU).
    """

    block_mask: object = None
    compiled: bool = False

    @classmethod
    def from_positions(cls, position_ids: torch.Tensor, stream_len: int, block_size: int,
                       compiled: bool | None = None) -> FlexDualStreamAttention:
        """Build the block mask for position_ids [N, L or 2L] of dual-stream (or AR) rows."""
        from torch.nn.attention.flex_attention import create_block_mask

        n, s = position_ids.shape
        meta = slot_metadata(position_ids, stream_len, block_size)
        mask_mod = dual_stream_mask_mod(meta, block_size)
        device = position_ids.device
        block_mask = create_block_mask(mask_mod, n, None, s, s, device=str(device))
        return cls(mask=None, is_causal=False, block_mask=block_mask,
                   compiled=device.type == "cuda" if compiled is None else compiled)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """q [B, S, Hq, D], k/v [B, S, Hkv, D] -> [B, S, Hq, D]."""
        fn = _flex(self.compiled)
        out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=self.block_mask,
                 scale=scale, enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)


_FLEX_CACHE: dict[bool, object] = {}


def _flex(compiled: bool):
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    if compiled not in _FLEX_CACHE:
        _FLEX_CACHE[compiled] = torch.compile(flex_attention) if compiled else flex_attention
    if not compiled:
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return _FLEX_CACHE[compiled]
