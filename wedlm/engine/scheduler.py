"""Continuous batching: which sequences run in the next forward and how many tokens each feeds.

Each step every running sequence feeds its uncached committed tokens followed by
its decoder window (a WeDLM step has the shape of a speculative-decoding step:
schedule tokens, not phases), so prefills and decode windows of different
requests share one forward. Requests join from the waiting queue when a slot,
token budget and KV blocks are available, taking their prefix-cache hits first.
When blocks run out, the most recently admitted running request is preempted:
its blocks are freed, its committed tokens and window are kept, and it goes back
to the head of the queue to be recomputed (prefix hits make that cheap).

No torch here; tested on a fake KV configuration.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .request import SeqStatus, Sequence


@dataclass
class ScheduledSeq:
    """One sequence's share of a forward.

    Attributes:
        seq: the sequence.
        num_context: uncached committed tokens fed, from row `seq.num_cached`.
        with_window: the decoder's window (and AR anchor) follows the context,
            and the decoder updates from this forward's logits. False for a
            prefill chunk, which always leaves the last committed token unfed.
    """

    seq: Sequence
    num_context: int
    with_window: bool

    @property
    def query_len(self) -> int:
        return self.num_context + (len(self.seq.window) if self.with_window else 0)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    refused: list[Sequence] = field(default_factory=list)


class Scheduler:
    """FCFS continuous-batching scheduler.

    Args:
        block_manager: the KV block allocator.
        max_num_seqs: most sequences in one forward.
        max_num_batched_tokens: most tokens fed in one forward; long prompts are
            prefilled in chunks.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 2:
            raise ValueError(f"max_num_seqs must be >= 1 and max_num_batched_tokens >= 2, "
                             f"got {max_num_seqs}, {max_num_batched_tokens}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Plan the next forward.

        Never returns an empty plan while requests are unfinished: a request that
        cannot run even alone is moved to `refused` (its blocks freed).
        """
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            item = self._plan(seq, budget)
            if item is None:
                i += 1
                continue
            if not self._reserve(seq, item, out):
                break  # seq itself was preempted; everything after it too
            out.scheduled.append(item)
            budget -= item.query_len
            i += 1
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not seq.block_table:
                seq.stats.prefix_cache_hit_tokens += self.block_manager.admit(seq)
            item = self._plan(seq, budget)
            if item is None or not self.block_manager.grow(seq, seq.num_cached + item.query_len):
                if self.running or out.scheduled:
                    break  # wait for blocks to be freed
                if self._release_queued(seq):
                    continue  # queued requests held prefix-hit blocks: retry with them free
                self.waiting.popleft()  # cannot run even alone: refuse, never hang
                self.block_manager.free(seq)
                seq.status = SeqStatus.FINISHED
                out.refused.append(seq)
                continue
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(item)
            budget -= item.query_len
        return out

    def _release_queued(self, head: Sequence) -> bool:
        """Free the blocks that waiting requests other than `head` took at admission; True if any.

        A request admitted with prefix hits keeps them while it waits; once
        preempted requests are queued in front of it, those blocks could make
        the head look as if it could never run. They are re-admitted later.
        """
        released = False
        for other in self.waiting:
            if other is not head and other.block_table:
                self.block_manager.free(other)
                released = True
        return released

    def _plan(self, seq: Sequence, budget: int) -> ScheduledSeq | None:
        """Feed everything uncached plus the window if it fits, else a prefill chunk."""
        uncached = seq.num_uncached
        if uncached + len(seq.window) <= budget and (uncached or seq.window):
            return ScheduledSeq(seq, uncached, True)
        chunk = min(budget, uncached - 1)  # keep the last committed token for the decoding forward
        return ScheduledSeq(seq, chunk, False) if chunk > 0 else None

    def _reserve(self, seq: Sequence, item: ScheduledSeq, out: SchedulerOutput) -> bool:
        """Grow seq's blocks, preempting from the tail of `running`; False if seq itself went."""
        rows = seq.num_cached + item.query_len
        while not self.block_manager.grow(seq, rows):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and put it back at the head of the queue (tokens and window kept)."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SeqStatus.WAITING
        seq.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished (or aborted) sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SeqStatus.FINISHED
