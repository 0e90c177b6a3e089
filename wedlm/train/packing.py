"""Sequence packing: documents into fixed-length rows whose attention never crosses a document.

What: `PackedRow` is one row of L clean tokens with a document id, a
document-relative logical position and a `maskable` flag (scored/maskable; False
for SFT prompt tokens and padding) per token. `Packer` lays shuffled documents
end to end into rows, splitting documents longer than L and padding the tail of
a row with a padding "document" that nothing scores.

Why: training rows must be dense (2-core CPU time is the budget) while every
document stays independent; the masking module turns document ids into the
block-diagonal visibility. Packing is deterministic in (seed, epoch), so a
resumed run regenerates exactly the rows it would have seen (resume = row index).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Document:
    """A tokenised document: ids and, per token, whether it may be masked/scored."""

    ids: list[int]
    maskable: list[bool]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.maskable):
            raise ValueError(f"ids ({len(self.ids)}) and maskable ({len(self.maskable)}) differ in length")


@dataclass(slots=True)
class PackedRow:
    """One packed row of L tokens (all tensors [L]).

    tokens: int64 ids; doc_ids: int64, equal within a document, increasing;
    positions: int64, 0 at each document's first token; maskable: bool.
    """

    tokens: torch.Tensor
    doc_ids: torch.Tensor
    positions: torch.Tensor
    maskable: torch.Tensor


def pack_spans(lengths: list[int], order: list[int], seq_len: int) -> list[list[tuple[int, int, int]]]:
    """Greedy packing plan: rows of (doc index, start, end) spans, each row <= seq_len tokens.

    Documents are taken in `order`; one longer than `seq_len` is cut into pieces
    that each start a new document. A document that does not fit the rest of a
    row starts the next row (so short documents are never split).
    """
    rows: list[list[tuple[int, int, int]]] = []
    row: list[tuple[int, int, int]] = []
    used = 0
    for d in order:
        n = lengths[d]
        for start in range(0, n, seq_len):
            end = min(n, start + seq_len)
            if used + end - start > seq_len:
                rows.append(row)
                row, used = [], 0
            row.append((d, start, end))
            used += end - start
    if row:
        rows.append(row)
    return rows


def make_row(docs: list[Document], spans: list[tuple[int, int, int]], seq_len: int, pad_id: int) -> PackedRow:
    """Materialise one planned row; the tail is a padding document (not maskable)."""
    tokens, doc_ids, positions, maskable = [], [], [], []
    for i, (d, start, end) in enumerate(spans):
        tokens += docs[d].ids[start:end]
        maskable += docs[d].maskable[start:end]
        doc_ids += [i] * (end - start)
        positions += range(end - start)
    pad = seq_len - len(tokens)
    tokens += [pad_id] * pad
    maskable += [False] * pad
    doc_ids += [len(spans)] * pad
    positions += range(pad)
    return PackedRow(torch.tensor(tokens, dtype=torch.int64), torch.tensor(doc_ids, dtype=torch.int64),
                     torch.tensor(positions, dtype=torch.int64), torch.tensor(maskable, dtype=torch.bool))


class Packer:
    """Endless stream of packed rows over shuffled epochs; `row(i)` is deterministic in (seed, i)."""

    def __init__(self, docs: list[Document], seq_len: int, pad_id: int, seed: int) -> None:
        if not docs:
            raise ValueError("no documents to pack")
        self.docs, self.seq_len, self.pad_id, self.seed = docs, seq_len, pad_id, seed
        self._lengths = [len(d.ids) for d in docs]
        self._plans: dict[int, list] = {}
        self._epoch_starts = [0]  # first row index of each epoch seen so far

    def _plan(self, epoch: int) -> list[list[tuple[int, int, int]]]:
        if epoch not in self._plans:
            order = list(range(len(self.docs)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._plans = {epoch: pack_spans(self._lengths, order, self.seq_len)}  # keep one epoch
        return self._plans[epoch]

    def row(self, index: int) -> PackedRow:
        """The `index`-th row of the stream (epochs follow one another)."""
        while self._epoch_starts[-1] <= index:
            epoch = len(self._epoch_starts) - 1
            self._epoch_starts.append(self._epoch_starts[-1] + len(self._plan(epoch)))
        epoch = max(e for e, s in enumerate(self._epoch_starts) if s <= index)
        spans = self._plan(epoch)[index - self._epoch_starts[epoch]]
        return make_row(self.docs, spans, self.seq_len, self.pad_id)
