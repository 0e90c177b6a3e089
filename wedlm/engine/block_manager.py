"""Paged KV block allocation with reference counts and exact prefix caching (no torch).

The cache is `num_blocks` blocks of `block_size` rows. A sequence owns a block
table; rows are written in order, so block i holds positions
[i*block_size, (i+1)*block_size).

Prefix caching: once a block is full of COMMITTED tokens whose cache rows are
valid, it is registered under the key (key of the previous block, its tokens).
Keys are exact (a tuple compare, no hash collisions can alias content) and
chain through a serial id, so a block is only found after the same full
prefix. A later request whose prompt starts with the same full blocks takes a
reference on them instead of recomputing. Freed blocks keep their content and
key in an LRU free queue until reallocated, so hits survive the first request
finishing. Uncommitted window rows never enter a registered block.
"""

from __future__ import annotations

from collections import OrderedDict

from .request import Sequence

ROOT_KEY = -1


class BlockManager:
    """Allocates blocks to sequences.

    Args:
        num_blocks: blocks in the cache (>= 1).
        block_size: rows per block (>= 1).
        enable_prefix_caching: register and reuse full committed blocks.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_key: list[tuple[int, tuple[int, ...]] | None] = [None] * num_blocks
        self.block_serial = [0] * num_blocks
        self.key_to_block: dict[tuple[int, tuple[int, ...]], int] = {}
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._next_serial = 0
        self.hit_tokens = 0
        self.query_tokens = 0

    @property
    def num_free(self) -> int:
        """Blocks with no owner (cached-but-free ones included)."""
        return len(self.free_queue)

    def blocks_for(self, num_rows: int) -> int:
        return -(-num_rows // self.block_size)

    def extra_blocks_needed(self, seq: Sequence, num_rows: int) -> int:
        """Blocks to add so that seq's table covers `num_rows` rows."""
        return max(0, self.blocks_for(num_rows) - len(seq.block_table))

    # ---- prefix cache -------------------------------------------------------------

    def match_prefix(self, tokens: list[int]) -> list[int]:
        """Registered blocks holding the longest full-block prefix of `tokens[:-1]`.

        At least one token is always left to compute, so that the forward that
        follows has something to feed (the AR anchor). Does not take references.
        """
        if not self.enable_prefix_caching:
            return []
        bs, parent, found = self.block_size, ROOT_KEY, []
        for start in range(0, len(tokens) - 1 - bs + 1, bs):
            block = self.key_to_block.get((parent, tuple(tokens[start:start + bs])))
            if block is None:
                break
            found.append(block)
            parent = self.block_serial[block]
        return found

    def admit(self, seq: Sequence) -> int:
        """Give a sequence with no blocks its prefix-cache hits; returns hit tokens.

        Sets block_table to the hit blocks and num_cached to the rows they hold.
        """
        if seq.block_table:
            raise ValueError(f"request {seq.request_id} already holds blocks")
        hits = self.match_prefix(seq.tokens)
        for block in hits:
            self._take(block)
        seq.block_table = list(hits)
        seq.num_cached = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        seq.last_block_key = self.block_serial[hits[-1]] if hits else ROOT_KEY
        self.query_tokens += len(seq.tokens)
        self.hit_tokens += seq.num_cached
        return seq.num_cached

    def register_full_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that are now full of committed, cache-valid tokens."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_cached, len(seq.tokens)) // bs
        for i in range(seq.num_hashed_blocks, full):
            key = (seq.last_block_key, tuple(seq.tokens[i * bs:(i + 1) * bs]))
            block = seq.block_table[i]
            existing = self.key_to_block.get(key)
            if existing is None:
                self._forget(block)
                self.key_to_block[key] = block
                self.block_key[block] = key
                self._next_serial += 1
                self.block_serial[block] = self._next_serial
                existing = block
            seq.last_block_key = self.block_serial[existing]
            seq.num_hashed_blocks = i + 1

    def reset_prefix_cache(self) -> bool:
        """Forget every registered block, so later requests find no hit; only while no sequence
        holds a block (a held block's key chains its sequence's next registrations).

        Returns:
            True when reset, False (nothing changed) while some sequence holds blocks.
        """
        if any(self.ref_counts):
            return False
        self.key_to_block.clear()
        self.block_key = [None] * self.num_blocks
        return True

    # ---- allocation ---------------------------------------------------------------

    def grow(self, seq: Sequence, num_rows: int) -> bool:
        """Extend seq's table to cover `num_rows` rows; False (and no change) if blocks run out."""
        need = self.extra_blocks_needed(seq, num_rows)
        if need > self.num_free:
            return False
        for _ in range(need):
            block, _ = self.free_queue.popitem(last=False)  # least recently freed first
            self._forget(block)
            self.ref_counts[block] = 1
            seq.block_table.append(block)
        return True

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks reaching zero go to the free queue (content kept)."""
        for block in reversed(seq.block_table):  # tail blocks are evicted first
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
                if self.block_key[block] is None:  # nothing to reuse: hand it out first
                    self.free_queue.move_to_end(block, last=False)
        seq.block_table = []
        seq.num_cached = 0
        seq.num_hashed_blocks = 0
        seq.last_block_key = ROOT_KEY

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free_queue[block]
        self.ref_counts[block] += 1

    def _forget(self, block: int) -> None:
        key = self.block_key[block]
        if key is not None:
            if self.key_to_block.get(key) == block:
                del self.key_to_block[key]
            self.block_key[block] = None
