"""The vectorised `PagedAttention.build` against a per-token reference loop, and padding
(`Padding`, the compiled path's shape buckets) that changes no real output and no real cache row;
`as_tensor`, the host-to-tensor step of the metadata and the runner's inputs."""

import numpy as np
import pytest
import torch

from wedlm.model import KVCache, Padding, PagedAttention, SequenceSlice, as_tensor, load_model

BS = 4


def reference(seqs):
    """slot_mapping, kv_slots (padded with 0) and mask, one token at a time."""
    slot_mapping, kv_rows, vis = [], [], []
    max_q = max(s.query_len for s in seqs)
    max_kv = max(s.context_len + s.query_len for s in seqs)
    for s in seqs:
        total = s.context_len + s.query_len
        row = [s.block_table[p // BS] * BS + p % BS for p in range(total)]
        slot_mapping += row[s.context_len:]
        kv_rows.append(row + [0] * (max_kv - total))
        vis.append([[j >= s.query_len or key <= s.context_len + j for key in range(max_kv)] for j in range(max_q)])
    return slot_mapping, kv_rows, vis


def test_build_matches_per_token_reference():
    cache = KVCache(1, 16, BS, 1, 2, torch.float32, "cpu")
    seqs = [SequenceSlice([5, 2, 9], 3, 6), SequenceSlice([7], 0, 1), SequenceSlice([1, 0, 3, 4], 10, 3)]
    meta = PagedAttention.build(cache, seqs)
    slots, kv, vis = reference(seqs)
    assert meta.slot_mapping.tolist() == slots
    assert meta.kv_slots.tolist() == kv
    assert meta.mask[:, 0].tolist() == vis
    assert meta.q_index.tolist() == [[0, 1, 2, 3, 4, 5], [6, 0, 0, 0, 0, 0], [7, 8, 9, 0, 0, 0]]
    assert meta.t_index.tolist() == [0, 1, 2, 3, 4, 5, 6, 12, 13, 14]
    single = PagedAttention.build(cache, [SequenceSlice([5, 2], 6, 1)])
    assert single.mask is None and single.q_index is None and single.t_index is None
    assert single.slot_mapping.tolist() == [2 * BS + 2]


def run(model, cache, seqs, ids, pos, pad=None):
    meta = PagedAttention.build(cache, seqs, pad=pad)
    n = ids.shape[0]
    if pad is not None:
        ids = torch.cat([ids, torch.zeros(pad.tokens - n, dtype=torch.int64)])
        pos = torch.cat([pos, torch.zeros(pad.tokens - n, dtype=torch.int64)])
    with torch.inference_mode():
        return model.hidden_states(ids, pos, meta)[:n]


# (sequences, positions of their fed tokens, padded sizes): a mixed batch; one sequence with
# one query (a batch-1 AR step: one token, keys padded to the bucket); the same with its tokens
# padded to 2 (a padded token beside one real query); one sequence of three queries padded to
# four tokens and four queries (a batch-1 window step: no gathers, a padded query row); three
# one-query sequences padded to four (a batched AR step).
PADDING_CASES = {
    "mixed": ([SequenceSlice([3, 1, 6], 5, 4), SequenceSlice([0, 2], 0, 7)], [5, 6, 7, 8] + list(range(7)),
              Padding(tokens=16, batch=4, queries=8, keys=64, pad_slot=8 * BS)),
    "batch1_one_query": ([SequenceSlice([3, 1, 6], 5, 1)], [5], Padding(1, 1, 1, 64, 8 * BS)),
    "batch1_one_query_two_tokens": ([SequenceSlice([3, 1, 6], 5, 1)], [5], Padding(2, 1, 1, 64, 8 * BS)),
    "batch1_padded_queries": ([SequenceSlice([3, 1, 6], 5, 3)], [5, 6, 7], Padding(4, 1, 4, 64, 8 * BS)),
    "batch3_one_query": ([SequenceSlice([3, 1], 5, 1), SequenceSlice([0], 2, 1), SequenceSlice([6, 7], 7, 1)],
                         [5, 2, 7], Padding(4, 4, 1, 64, 8 * BS)),
}


@pytest.mark.parametrize("case", list(PADDING_CASES))
def test_padding_changes_no_output_and_no_real_cache_row(tiny_wedlm, case):
    model = load_model(tiny_wedlm)
    cfg = model.config
    seqs, positions, padding = PADDING_CASES[case]
    ids = torch.randint(0, 250, (len(positions),), generator=torch.Generator().manual_seed(1))
    pos = torch.tensor(positions)
    caches = []
    for pad in (None, padding):
        cache = KVCache(cfg.num_hidden_layers, 9, BS, cfg.num_key_value_heads, cfg.head_dim, torch.float32, "cpu")
        for layer in range(cfg.num_hidden_layers):  # the same "earlier" context in both caches
            g = torch.Generator().manual_seed(layer)
            cache.k[layer].copy_(torch.randn(cache.k[layer].shape, generator=g))
            cache.v[layer].copy_(torch.randn(cache.v[layer].shape, generator=g))
        caches.append((cache, run(model, cache, seqs, ids, pos, pad)))
    (plain, out_plain), (padded, out_padded) = caches
    assert torch.allclose(out_plain, out_padded, atol=1e-5, rtol=1e-5)
    written = set(reference(seqs)[0])
    untouched = torch.tensor([r for r in range(8 * BS) if r not in written])
    for layer in range(cfg.num_hidden_layers):  # padded tokens wrote only into the scratch block
        for a, b in ((plain.k[layer], padded.k[layer]), (plain.v[layer], padded.v[layer])):
            a, b = a.view(-1, *a.shape[2:]), b.view(-1, *b.shape[2:])
            assert torch.equal(a[untouched], b[untouched])
            assert torch.allclose(a[:8 * BS], b[:8 * BS], atol=1e-5, rtol=1e-5)


def test_padded_batch1_one_query_metadata():
    """The compiled batch-1 AR step: one real query, one padded token, keys padded to 64."""
    cache = KVCache(1, 9, BS, 1, 2, torch.float32, "cpu")
    meta = PagedAttention.build(cache, [SequenceSlice([3, 1, 6], 5, 1)], pad=Padding(2, 1, 1, 64, 8 * BS))
    assert meta.q_index.tolist() == [[0]] and meta.t_index.tolist() == [0, 0]
    assert meta.slot_mapping.tolist() == [1 * BS + 1, 8 * BS]  # position 5 -> block 1, row 1; pad token
    assert meta.kv_slots.shape == (1, 64) and meta.kv_slots[0, 6:].eq(8 * BS).all()
    assert meta.kv_slots[0, :6].tolist() == [12, 13, 14, 15, 4, 5]
    assert meta.mask.shape == (1, 1, 1, 64)
    assert meta.mask[0, 0, 0].tolist() == [True] * 6 + [False] * 58


def test_padded_batch1_tokens_as_queries_metadata():
    """One sequence padded to as many tokens as queries (every batch-1 engine step): no gathers
    (the flat tokens are the queries, the padded one a padded query row that sees every key)."""
    cache = KVCache(1, 9, BS, 1, 2, torch.float32, "cpu")
    meta = PagedAttention.build(cache, [SequenceSlice([3, 1, 6], 5, 3)], pad=Padding(4, 1, 4, 64, 8 * BS))
    assert meta.q_index is None and meta.t_index is None
    assert meta.slot_mapping.tolist() == [1 * BS + 1, 1 * BS + 2, 1 * BS + 3, 8 * BS]
    assert meta.kv_slots[0, :8].tolist() == [12, 13, 14, 15, 4, 5, 6, 7] and meta.kv_slots[0, 8:].eq(8 * BS).all()
    assert meta.mask[0, 0, :, :9].tolist() == [[True] * 6 + [False] * 3, [True] * 7 + [False] * 2,
                                               [True] * 8 + [False], [True] * 9]
    assert meta.mask[0, 0, 3].all()  # the padded query row
    one = PagedAttention.build(cache, [SequenceSlice([3, 1, 6], 5, 1)], pad=Padding(1, 1, 1, 64, 8 * BS))
    assert one.q_index is None and one.t_index is None
    assert one.slot_mapping.tolist() == [1 * BS + 1] and one.mask[0, 0, 0].tolist() == [True] * 6 + [False] * 58


def test_as_tensor_shares_cpu_memory_and_makes_lists_int64():
    cpu = torch.device("cpu")
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    shared = as_tensor(array, cpu)
    array[1, 2] = 40  # no copy on the CPU: the tensor sees the write
    assert shared.tolist() == [[0, 1, 2], [3, 4, 40]] and shared.dtype == torch.int64
    strided = as_tensor(array[:, ::2], cpu)  # a non-contiguous view is made contiguous
    assert strided.tolist() == [[0, 2], [3, 40]] and strided.is_contiguous()
    from_list = as_tensor([7, 151643, 0], cpu)
    assert from_list.dtype == torch.int64 and from_list.tolist() == [7, 151643, 0]
    assert as_tensor(np.array([True, False]), cpu).dtype == torch.bool  # an array keeps its dtype
    assert as_tensor(None, cpu) is None


@pytest.mark.parametrize("case", ["mixed", "batch1_padded_queries", "batch3_one_query"])
def test_key_ends_are_the_masks_rows_as_prefix_lengths(tiny_wedlm, case):
    """`build(..., key_ends=True)`: no mask, and key_ends[b, j] the length of the mask's row j of
    sequence b (every row a prefix: causal on the cache; padded rows and sequences see every key);
    a forward on them (SDPA, outside a compiled graph: the mask rebuilt from them) gives the
    mask's hidden states exactly."""
    seqs, positions, padding = PADDING_CASES[case]
    cache = KVCache(1, 9, BS, 1, 2, torch.float32, "cpu")
    with_mask = PagedAttention.build(cache, seqs, pad=padding)
    with_ends = PagedAttention.build(cache, seqs, pad=padding, key_ends=True)
    assert with_ends.mask is None and with_mask.key_ends is None
    rows = with_mask.mask[:, 0]  # [B, Q, K]
    lengths = rows.sum(-1)
    assert torch.equal(rows, torch.arange(rows.shape[-1]) < lengths[..., None])  # prefixes
    assert with_ends.key_ends.dtype == torch.int64 and torch.equal(with_ends.key_ends, lengths)
    model = load_model(tiny_wedlm)
    cfg = model.config
    ids = torch.randint(0, 250, (padding.tokens,), generator=torch.Generator().manual_seed(2))
    pos = torch.tensor(positions + [0] * (padding.tokens - len(positions)))
    outs = []
    for meta in (with_mask, with_ends):
        meta.kv_cache = KVCache(cfg.num_hidden_layers, 9, BS, cfg.num_key_value_heads, cfg.head_dim,
                                torch.float32, "cpu")
        with torch.inference_mode():
            outs.append(model.hidden_states(ids, pos, meta))
    assert torch.equal(outs[0], outs[1])
