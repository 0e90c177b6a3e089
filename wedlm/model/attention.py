"""Attention metadata and the torch SDPA attention backend (the reference path).

The model never decides who sees whom: every forward receives an explicit
metadata object that carries the visibility rule and, for inference, the paged
KV cache. Two kinds exist:

* `DenseAttention`: inputs shaped [batch, seq]; an arbitrary boolean visibility
  mask (training's dual-stream mask, docs/invariants.md "Dual-stream mask") or plain
  causal attention. No cache.
* `PagedAttention`: inputs flattened to [num_tokens] over a batch of sequences;
  each sequence's new tokens are written to its KV blocks (slot mapping) and
  attend causally on top of everything already cached for it (block table).
  This is the shape of every WeDLM decode step: the window, reordered
  filled-first, runs one causal forward on the prefix cache (paper section 5.2).

Both call `torch.nn.functional.scaled_dot_product_attention`, which runs on CPU
and CUDA. A faster backend can subclass the metadata and override `attend`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         is_causal: bool, scale: float) -> torch.Tensor:
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], mask bool [B|1, 1|Hq, Lq, Lk] (True = visible).

    Returns [B, Hq, Lq, D]. Grouped-query attention uses SDPA's `enable_gqa`
    when torch has it (no K/V copies), else repeats K/V heads.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=True)
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


@dataclass
class DenseAttention:
    """Visibility for un-cached [batch, seq] forwards.

    Attributes:
        mask: bool [batch or 1, 1, seq, seq], True where query i may attend key j;
            None together with `is_causal=True` means the lower-triangular mask.
            Every query row must see at least one key (SDPA returns NaN otherwise).
        is_causal: use the plain causal mask (ignored when `mask` is given).
    """

    mask: torch.Tensor | None = None
    is_causal: bool = True

    def __post_init__(self) -> None:
        if self.mask is not None and self.mask.dtype != torch.bool:
            raise TypeError(f"DenseAttention.mask must be bool, got {self.mask.dtype}")

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """q [B, L, Hq, D], k/v [B, L, Hkv, D] -> [B, L, Hq, D]."""
        out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                   self.mask, self.mask is None and self.is_causal, scale)
        return out.transpose(1, 2)


class KVCache:
    """Paged KV cache: per layer, K and V of shape [num_blocks, block_size, kv_heads, head_dim].

    A token's slot is `block_table[pos // block_size] * block_size + pos % block_size`.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KVCache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def flat(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as [num_blocks * block_size, kv_heads, head_dim] views."""
        k, v = self.k[layer_idx], self.v[layer_idx]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass
class SequenceSlice:
    """One sequence's part of a paged forward.

    Attributes:
        block_table: physical block ids covering positions [0, context_len + query_len).
        context_len: tokens already in the cache (physical rows 0..context_len-1).
        query_len: new tokens fed this forward; they take physical rows
            context_len..context_len+query_len-1 and attend causally on the cache.
    """

    block_table: list[int]
    context_len: int
    query_len: int


@dataclass
class PagedAttention:
    """Metadata of a paged, batched forward over flattened tokens [num_tokens].

    Attributes:
        kv_cache: the cache the new K/V are written into and read from.
        slot_mapping: int64 [num_tokens], cache slot of each new token.
        kv_slots: int64 [batch, max_kv], slots read per sequence (padded with 0).
        q_index: int64 [batch, max_q], index of each (sequence, query) in the
            flat token axis (padded with 0); None when batch == 1.
        q_valid: bool [batch, max_q], real queries; None when batch == 1.
        mask: bool [batch, 1, max_q, max_kv] visibility; None when every query
            may see every key (a single sequence with one query token).
    """

    kv_cache: KVCache
    slot_mapping: torch.Tensor
    kv_slots: torch.Tensor
    q_index: torch.Tensor | None
    q_valid: torch.Tensor | None
    mask: torch.Tensor | None

    @classmethod
    def build(cls, kv_cache: KVCache, seqs: list[SequenceSlice],
              device: torch.device | str | None = None) -> "PagedAttention":
        """Slot mapping, gather indices and causal-on-cache mask for a batch.

        Raises:
            ValueError: a block table too short for context_len + query_len, or
                a sequence with query_len < 1.
        """
        bs = kv_cache.block_size
        device = device or kv_cache.k[0].device
        slots_per_seq: list[list[int]] = []
        q_lens, kv_lens, ctx_lens = [], [], []
        for s in seqs:
            total = s.context_len + s.query_len
            if s.query_len < 1:
                raise ValueError(f"query_len must be >= 1, got {s.query_len}")
            if len(s.block_table) * bs < total:
                raise ValueError(
                    f"block_table of {len(s.block_table)} blocks x {bs} covers fewer than "
                    f"context_len + query_len = {total} positions")
            # plain-Python slot arithmetic: far cheaper than a dozen tiny tensor ops per step
            slots_per_seq.append([b * bs + o for b in s.block_table[:-(-total // bs)] for o in range(bs)][:total])
            q_lens.append(s.query_len)
            kv_lens.append(total)
            ctx_lens.append(s.context_len)
        batch, max_q, max_kv = len(seqs), max(q_lens), max(kv_lens)
        slot_mapping = torch.tensor([x for sl, c in zip(slots_per_seq, ctx_lens) for x in sl[c:]],
                                    dtype=torch.int64)
        kv_slots = torch.tensor([sl + [0] * (max_kv - len(sl)) for sl in slots_per_seq], dtype=torch.int64)
        mask = q_index = q_valid = None
        if batch > 1 or max_q > 1:
            q_off = torch.arange(max_q)[None, :, None]  # [1, max_q, 1]
            key = torch.arange(max_kv)[None, None, :]  # [1, 1, max_kv]
            ctx = torch.tensor(ctx_lens)[:, None, None]
            qlen = torch.tensor(q_lens)[:, None, None]
            visible = key <= ctx + q_off  # causal on top of the cache
            visible |= q_off >= qlen  # padded query rows see everything (discarded)
            mask = visible[:, None]  # [batch, 1, max_q, max_kv]
        if batch > 1:
            starts = torch.tensor([0] + q_lens[:-1]).cumsum(0)[:, None]
            q_off = torch.arange(max_q)[None, :]
            q_valid = q_off < torch.tensor(q_lens)[:, None]
            q_index = torch.where(q_valid, starts + q_off, torch.zeros_like(q_off))
            q_valid = q_valid.to(device)
            q_index = q_index.to(device)
        return cls(kv_cache, slot_mapping.to(device), kv_slots.to(device), q_index, q_valid,
                   None if mask is None else mask.to(device))

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; writes k/v into the cache first."""
        k_cache, v_cache = self.kv_cache.flat(layer_idx)
        k_cache[self.slot_mapping] = k.to(k_cache.dtype)
        v_cache[self.slot_mapping] = v.to(v_cache.dtype)
        keys = k_cache[self.kv_slots].transpose(1, 2)  # [B, Hkv, max_kv, D]
        values = v_cache[self.kv_slots].transpose(1, 2)
        if self.q_index is None:
            queries = q.unsqueeze(0)  # [1, T, Hq, D]
        else:
            queries = q[self.q_index]  # [B, max_q, Hq, D]
        out = sdpa(queries.transpose(1, 2), keys, values, self.mask, False, scale)
        out = out.transpose(1, 2)  # [B, max_q, Hq, D]
        if self.q_valid is None:
            return out[0]
        return out[self.q_valid]
