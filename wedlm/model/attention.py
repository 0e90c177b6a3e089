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

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .memory import zeroed_cpu_tensor

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
        self.k = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [_zeros(shape, dtype, device) for _ in range(num_layers)]

    def flat(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as [num_blocks * block_size, kv_heads, head_dim] views."""
        k, v = self.k[layer_idx], self.v[layer_idx]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """One layer's K or V cache, zero-filled. On a CPU the pages are committed as blocks are first
    written (`zeroed_cpu_tensor`): the default budget sizes a cache for max_num_seqs full-length
    requests, and zeroing all of it up front took most of a fresh process's start."""
    if torch.device(device).type == "cpu":
        return zeroed_cpu_tensor(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


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


@dataclass(frozen=True)
class Padding:
    """Padded sizes of a paged forward (fixed shapes for compiled code and CUDA graphs).

    Padded tokens write their K/V into `pad_slot` (a scratch cache row no sequence owns)
    and are no real query (their outputs are dropped); padded batch rows, query columns
    and key columns are hidden by the mask. Real rows' outputs are unchanged. A padded
    build always carries `mask`; `q_index` and `t_index` too, unless the batch is one
    sequence with as many padded tokens as padded queries, whose gathers would be identities.

    Attributes:
        tokens: >= the real number of tokens.
        batch: >= the number of sequences.
        queries: >= the longest query_len.
        keys: >= the longest context_len + query_len.
        pad_slot: the scratch cache slot (None only inside `build`: no padding).
    """

    tokens: int
    batch: int
    queries: int
    keys: int
    pad_slot: int | None


@dataclass
class PagedAttention:
    """Metadata of a paged, batched forward over flattened tokens [num_tokens].

    Attributes:
        kv_cache: the cache the new K/V are written into and read from.
        slot_mapping: int64 [num_tokens], cache slot of each new token.
        kv_slots: int64 [batch, max_kv], slots read per sequence (padding: slot 0 or the pad slot).
        q_index: int64 [batch, max_q], index of each (sequence, query) in the
            flat token axis (padded with 0); None when the flat tokens are the one
            sequence's queries in order (batch 1, as many tokens as queries, padded ones included).
        t_index: int64 [num_tokens], row of each flat token in the flattened
            [batch * max_q] attention output; None exactly when q_index is None.
        mask: bool [batch, 1, max_q, max_kv] visibility; None when every query
            may see every key (a single sequence with one query token, no padding), or when
            `key_ends` stands for it.
        key_ends: int64 [batch, max_q], the same visibility as prefix lengths (query j of
            sequence b sees keys 0..key_ends[b, j]-1), built instead of `mask` when asked
            (`build(..., key_ends=True)`: the compiled CPU window kernel reads these, with no
            [max_q, max_kv] array to build per step); else None.
    """

    kv_cache: KVCache
    slot_mapping: torch.Tensor
    kv_slots: torch.Tensor
    q_index: torch.Tensor | None
    t_index: torch.Tensor | None
    mask: torch.Tensor | None
    key_ends: torch.Tensor | None = None

    @classmethod
    def build(cls, kv_cache: KVCache, seqs: list[SequenceSlice], device: torch.device | str | None = None,
              pad: Padding | None = None, key_ends: bool = False) -> PagedAttention:
        """Slot mapping, gather indices and causal-on-cache mask for a batch, vectorised
        over all tokens (numpy on the host, one copy per tensor to `device`).

        Every decode step builds this after a forward has swept the caches, so each numpy call
        runs cold (several microseconds): the build keeps them few, a handful per step plus
        two small ones per sequence.

        Args:
            pad: padded sizes (`Padding`); None = the exact sizes.
            key_ends: give the causal-on-cache visibility as `key_ends` instead of `mask`.

        Raises:
            ValueError: a block table too short for context_len + query_len, a
                sequence with query_len < 1, or padded sizes below the real ones.
        """
        bs = kv_cache.block_size
        device = kv_cache.k[0].device if device is None else torch.device(device)
        ctx = [s.context_len for s in seqs]
        qlen = [s.query_len for s in seqs]
        total = [c + q for c, q in zip(ctx, qlen)]
        for s, n in zip(seqs, total):
            if s.query_len < 1:
                raise ValueError(f"query_len must be >= 1, got {s.query_len}")
            if len(s.block_table) * bs < n:
                raise ValueError(f"block_table of {len(s.block_table)} blocks x {bs} covers fewer than "
                                 f"context_len + query_len = {n} positions")
        batch, num_tokens, max_q, max_kv = len(seqs), sum(qlen), max(qlen), max(total)
        if pad is None:
            pad = Padding(num_tokens, batch, max_q, max_kv, None)
        elif pad.tokens < num_tokens or pad.batch < batch or pad.queries < max_q or pad.keys < max_kv:
            raise ValueError(f"padding {pad} is below the real sizes: tokens {num_tokens}, batch {batch}, "
                             f"queries {max_q}, keys {max_kv}")
        fill = 0 if pad.pad_slot is None else pad.pad_slot
        kv_slots = _kv_slots(seqs, total, pad.batch, pad.keys, bs, fill)
        slot_mapping = np.full(pad.tokens, fill, np.int64)
        slot_mapping[:num_tokens] = np.concatenate([row[c:n] for row, c, n in zip(kv_slots, ctx, total)])
        ctx_p, qlen_p = np.zeros((2, pad.batch), np.int64)
        ctx_p[:batch], qlen_p[:batch] = ctx, qlen
        q_index = t_index = mask = ends = None
        # the flat tokens are the one sequence's queries in order (padded tokens included):
        # no gathers; padded tokens are then padded queries, which the mask lets see every key
        if pad.batch > 1 or pad.tokens != pad.queries:
            q_index, t_index = _query_indices(qlen_p, num_tokens, pad.tokens, pad.queries)
        if pad.pad_slot is not None or pad.batch > 1 or pad.queries > 1:
            if key_ends:
                ends = as_tensor(_causal_key_ends(ctx_p, qlen_p, pad.queries, pad.keys), device)
            else:
                mask = _causal_on_cache(ctx_p, qlen_p, pad.queries, pad.keys, device)
        return cls(kv_cache, as_tensor(slot_mapping, device), as_tensor(kv_slots, device),
                   as_tensor(q_index, device), as_tensor(t_index, device), mask, ends)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; writes k/v into the cache first.

        Every gather and scatter is a flat `index_select` / `index_copy_` along the first axis:
        the same values as advanced indexing with the 2-D index tensors, about 5x faster on a
        CPU for a [32, 64]-slot gather (advanced indexing took 20% of a batch-32 `ar` step).
        """
        k_cache, v_cache = self.kv_cache.flat(layer_idx)
        k_cache.index_copy_(0, self.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, self.slot_mapping, v.to(v_cache.dtype))
        if self.q_index is None:
            queries = q.unsqueeze(0)  # [1, T, Hq, D]
        else:
            queries = _rows(q, self.q_index)  # [B, max_q, Hq, D]
        out = _cpu_kernel_attention(queries.transpose(1, 2), k_cache, v_cache, self.kv_slots, self.mask, scale,
                                    self.key_ends)
        if out is None:
            keys = _rows(k_cache, self.kv_slots).transpose(1, 2)  # [B, Hkv, max_kv, D]
            values = _rows(v_cache, self.kv_slots).transpose(1, 2)
            mask = self.mask
            if self.key_ends is not None:  # prefix lengths -> the mask they stand for
                key = torch.arange(keys.shape[2], device=keys.device)
                mask = (key < self.key_ends.unsqueeze(-1)).unsqueeze(1)
            out = sdpa(queries.transpose(1, 2), keys.to(queries.dtype), values.to(queries.dtype), mask,
                       False, scale)
        out = out.transpose(1, 2)  # [B, max_q, Hq, D]
        if self.t_index is None:
            return out[0]
        return _rows(out.reshape(-1, *out.shape[2:]), self.t_index)  # [T, Hq, D]


# Kernels that compiled CPU graphs run instead of SDPA for float32 paged attention; the engine
# installs its C++ operators here (`engine/native.py`, `use_cpu_attention`), None keeps SDPA.
# Both read the keys and values in place in the layer's paged caches k/v [S, Hkv, D] through the
# slot table slots int64 [B, Lk] (key j of sequence b is cache row slots[b, j]), with no gathered
# [B, Hkv, Lk, D] copy. `one_query`: one query per head over exactly the sequence's keys, no mask
# (the batch-1 `ar` step): q [B, Hq, 1, D], k, v, scale, slots -> [B, Hq, 1, D]. `window`: any other
# step, with its mask: q [B, Hq, Lq, D], k, v, bool mask [B or 1, 1, Lq, Lk] or None, scale, slots,
# key_ends int64 [B, Lq] or None (the mask as prefix lengths, `PagedAttention.key_ends`) -> [B, Hq, Lq, D].
_cpu_attention: dict = {"one_query": None, "window": None}


def use_cpu_attention(one_query=None, window=None) -> None:
    """Install the float32 CPU attention kernels of compiled graphs traced from now on
    (`PagedAttention.attend`); None for either keeps SDPA there."""
    _cpu_attention["one_query"], _cpu_attention["window"] = one_query, window


def _cpu_kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
                          mask: torch.Tensor | None, scale: float,
                          key_ends: torch.Tensor | None = None) -> torch.Tensor | None:
    """The installed C++ kernel's attention (`use_cpu_attention`) for a compiled float32 CPU graph,
    else None (SDPA). q [B, Hq, Lq, D], k/v the paged caches [S, Hkv, D], slots int64 [B, Lk]."""
    if not (torch.compiler.is_compiling() and q.device.type == "cpu" and q.dtype == k.dtype == torch.float32):
        return None
    # a symbolic size is never 1 (torch specialises 1): only the one-query graph tests true
    if mask is None and key_ends is None and q.shape[2] == 1 and _cpu_attention["one_query"] is not None:
        return _cpu_attention["one_query"](q, k, v, scale, slots)
    if _cpu_attention["window"] is not None:
        return _cpu_attention["window"](q, k, v, mask, scale, slots, key_ends)
    return None


def _rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for an int64 index of any shape, gathering whole rows of the first axis:
    [*index.shape, *table.shape[1:]]."""
    return torch.index_select(table, 0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def _kv_slots(seqs: list[SequenceSlice], total: list[int], batch: int, keys: int, block_size: int,
              fill: int) -> np.ndarray:
    """int64 [batch, keys]: `block_table[p // block_size] * block_size + p % block_size` for key p
    of sequence b while p < total[b], else `fill` (padded keys and padded sequences)."""
    slots = np.full((batch, keys), fill, np.int64)
    for i, (s, n) in enumerate(zip(seqs, total)):
        slots[i, :n] = _table_slots(tuple(s.block_table[:-(-n // block_size)]), block_size)[:n]
    return slots


@functools.lru_cache(maxsize=32)
def _table_slots(table: tuple[int, ...], block_size: int) -> np.ndarray:
    """The cache row of every position a block table covers, int64 [len(table) * block_size]
    (read-only, shared). A sequence's table changes once per `block_size` tokens, so at small
    batches most steps find it here: two numpy calls a sequence instead of six (each several
    microseconds in the caches a forward leaves cold). 32 tables of up to 8 bytes a position."""
    out = (np.array(table, np.int64)[:, None] * block_size + _arange(block_size)).reshape(-1)
    out.flags.writeable = False
    return out


def _query_indices(qlen: np.ndarray, num_tokens: int, tokens: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """q_index int64 [batch, queries] (flat token of each (sequence, query), 0 when padded) and
    t_index int64 [tokens] (row of each flat token in the [batch * queries] output, 0 when padded)
    for the padded query lengths `qlen` [batch]."""
    starts = np.cumsum(qlen) - qlen
    q_off = _arange(queries)
    real = q_off < qlen[:, None]  # [B, Q]
    q_index = np.where(real, starts[:, None] + q_off, 0)
    t_index = np.zeros(tokens, np.int64)
    t_index[q_index[real]] = np.flatnonzero(real)  # real (b, j) in flat-token order
    return q_index, t_index


def _arange(n: int) -> np.ndarray:
    """A read-only np.arange(n) (int64): a view of a shared one of the next power-of-two length,
    so that key counts that change every step (unpadded keys) still find it made."""
    return _arange_pow2(1 << max(n - 1, 0).bit_length())[:n]


@functools.lru_cache(maxsize=64)
def _arange_pow2(n: int) -> np.ndarray:
    out = np.arange(n, dtype=np.int64)
    out.flags.writeable = False
    return out


def _causal_on_cache(ctx: np.ndarray, qlen: np.ndarray, max_q: int, max_kv: int,
                     device: torch.device) -> torch.Tensor:
    """bool [B, 1, max_q, max_kv]: query j of sequence b sees keys 0..ctx[b]+j; padded query
    rows (j >= qlen[b]) see every key (their output is discarded; SDPA needs one visible key).

    Built with numpy for a CPU forward (a tiny numpy op costs ~1 us, a torch op several), on the
    device for a GPU one (no [B, Q, K] host-to-device copy).
    """
    if device.type == "cpu":
        key, q_off = _arange(max_kv), _arange(max_q)[:, None]
        visible = key <= ctx[:, None, None] + q_off
        if qlen.min() < max_q:  # padded query rows
            visible |= q_off >= qlen[:, None, None]
        return torch.from_numpy(visible[:, None])
    key = torch.arange(max_kv, device=device)[None, None, :]  # [1, 1, K]
    q_off = torch.arange(max_q, device=device)[None, :, None]  # [1, Q, 1]
    ctx_t = as_tensor(ctx, device)[:, None, None]
    qlen_t = as_tensor(qlen, device)[:, None, None]
    return ((key <= ctx_t + q_off) | (q_off >= qlen_t))[:, None]


def _causal_key_ends(ctx: np.ndarray, qlen: np.ndarray, max_q: int, max_kv: int) -> np.ndarray:
    """int64 [B, max_q]: `_causal_on_cache`'s visibility as prefix lengths, ctx[b] + j + 1 keys for
    query j of sequence b, every key (max_kv) for a padded query row (j >= qlen[b])."""
    ends = ctx[:, None] + _arange(max_q + 1)[1:]
    if qlen.min() < max_q:  # padded query rows
        ends[_arange(max_q) >= qlen[:, None]] = max_kv
    return ends


def as_tensor(values: np.ndarray | list[int] | None, device: torch.device) -> torch.Tensor | None:
    """`values` as a tensor on `device`, through numpy; None stays None.

    An array keeps its dtype and shape; a list of ints becomes int64 [len(values)]. On the CPU
    the tensor shares numpy's memory (`torch.from_numpy`: no copy, no dispatch; a third of
    `torch.tensor`'s cost for a step's short lists); another device gets a non-blocking copy.
    """
    if values is None:
        return None
    array = np.array(values, np.int64) if isinstance(values, list) else np.ascontiguousarray(values)
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)
