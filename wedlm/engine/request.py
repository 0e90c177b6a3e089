"""Per-request state: committed tokens, KV bookkeeping and the decoding window.

A `Sequence` is what the scheduler, block manager, decoders and engine share.
Its invariants:

* `tokens` = prompt + committed output, in logical order; position p of the
  sequence is `tokens[p]`.
* cache rows 0..num_cached-1 hold valid K/V of tokens[:num_cached]
  (docs/invariants.md, "Cache validity"); `num_cached <= len(tokens)`.
* `window[i]` is the decoder's slot at logical position len(tokens) + i:
  a token id (filled / drafted) or None ([MASK]). It survives preemption.
* `block_table` covers at least the rows the next forward writes.

No torch here: this module is shared by the pure-Python scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .outputs import RequestStats
from .sampling_params import SamplingParams


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request being served.

    Attributes:
        request_id: caller-visible id.
        prompt_len: number of prompt tokens at the head of `tokens`.
        params: resolved sampling parameters.
        max_len: hard end of the sequence: prompt_len + max_tokens (intake refuses
            requests that do not fit max_model_len); generation stops with "length" there.
        window_size: W for this request.
        stop_ids: token ids that end generation (empty with ignore_eos).
    """

    request_id: str
    tokens: list[int]
    prompt_len: int
    params: SamplingParams
    max_len: int
    window_size: int
    stop_ids: frozenset[int] = frozenset()
    status: SeqStatus = SeqStatus.WAITING
    num_cached: int = 0
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    last_block_key: int = -1
    window: list[int | None] = field(default_factory=list)
    decoder_state: Any = None
    grammar: Any = None  # structured.GrammarState of a constrained request: the committed output's matcher
    generator: Any = None
    detokenizer: Any = None
    step_index: int = 0
    finish_reason: str | None = None
    error: str | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_forward_end: float | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    # logprobs (`logprobs.py`): of filled or drafted positions not yet committed, by position;
    # the prompt's, until the first delta carries them
    pending_logprobs: dict[int, Any] = field(default_factory=dict)
    prompt_logprobs: list | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def budget_left(self) -> int:
        """Tokens that may still be committed before `max_len`."""
        return self.max_len - len(self.tokens)

    @property
    def num_uncached(self) -> int:
        """Committed tokens whose K/V are not yet in the cache (fed before the window)."""
        return len(self.tokens) - self.num_cached
