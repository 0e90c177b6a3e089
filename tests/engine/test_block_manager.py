"""BlockManager on a fake KV configuration: allocation, ref counts, exact prefix caching."""

from wedlm.engine.block_manager import BlockManager
from wedlm.engine.request import Sequence
from wedlm.engine.sampling_params import SamplingParams


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens), len(tokens), SamplingParams(), max_len=100, window_size=4)


def commit_all(bm, s):
    bm.grow(s, len(s.tokens))
    s.num_cached = len(s.tokens)
    bm.register_full_blocks(s)


def test_grow_and_free_restore_counts():
    bm = BlockManager(num_blocks=10, block_size=4)
    s = seq(range(9))
    assert bm.admit(s) == 0
    assert bm.grow(s, 9 + 4)  # prompt + window rows
    assert len(s.block_table) == 4 and bm.num_free == 6
    assert not bm.grow(seq(range(3), "x"), 7 * 4)  # 7 blocks > 6 free: no change
    assert bm.num_free == 6
    bm.free(s)
    assert bm.num_free == 10 and s.block_table == []


def test_prefix_hit_shares_full_committed_blocks():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "a")
    bm.admit(a)
    commit_all(bm, a)
    assert a.num_hashed_blocks == 2  # rows 8, 9 do not fill a block
    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 99], "b")
    assert bm.admit(b) == 8
    assert b.block_table == a.block_table[:2]
    assert bm.ref_counts[a.block_table[0]] == 2
    assert (bm.hit_tokens, bm.query_tokens) == (8, 19)
    c = seq([1, 2, 3, 4, 0, 6, 7, 8, 9], "c")  # second block differs: only the first is reused
    assert bm.admit(c) == 4
    d = seq([9, 9, 9, 9, 1, 2, 3, 4, 5], "d")  # same block content after a different prefix: no hit
    assert bm.admit(d) == 0


def test_hit_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(range(8), "a")
    bm.admit(a)
    commit_all(bm, a)
    b = seq(range(8), "b")
    assert bm.admit(b) == 4  # the whole prompt is cached, but its last token must be fed


def test_freed_blocks_stay_reusable_until_reallocated():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5], "a")
    bm.admit(a)
    commit_all(bm, a)
    bm.free(a)
    assert bm.num_free == 4
    b = seq([1, 2, 3, 4, 7], "b")
    assert bm.admit(b) == 4
    bm.free(b)
    big = seq(range(10, 17), "big")  # needs every block: the cached ones get evicted
    bm.admit(big)
    assert bm.grow(big, 8)
    bm.free(big)
    assert bm.admit(seq([1, 2, 3, 4, 7], "c")) == 0


def test_window_rows_never_registered():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq([1, 2, 3], "s")
    bm.admit(s)
    bm.grow(s, 3 + 4)
    s.num_cached = 3  # the window rows 3..6 are written but not committed
    bm.register_full_blocks(s)
    assert s.num_hashed_blocks == 0 and not bm.key_to_block


def test_reset_prefix_cache_only_when_no_block_is_held():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = seq([1, 2, 3, 4, 5], "a")
    bm.admit(a)
    commit_all(bm, a)
    assert not bm.reset_prefix_cache()  # a still holds its blocks: nothing changes
    assert bm.match_prefix([1, 2, 3, 4, 9]) == a.block_table[:2]
    bm.free(a)
    assert bm.reset_prefix_cache()
    assert bm.match_prefix([1, 2, 3, 4, 9]) == [] and bm.num_free == 8
    b = seq([1, 2, 3, 4, 9], "b")
    assert bm.admit(b) == 0
    commit_all(bm, b)  # registration starts afresh after a reset
    bm.free(b)
    assert bm.admit(seq([1, 2, 3, 4, 7], "c")) == 4
