"""Shape buckets of the compiled forward: a step's sizes are padded up to a few fixed values.

Compiled code (and above all a CUDA graph) is specialised to the shapes it saw. Padding
the number of tokens, sequences, queries per sequence, keys per sequence and logit rows
of a step up to a bucket keeps the set of shapes small, so the forward is not
recompiled (or re-captured) every step. Small sizes get fine buckets (a 16-slot window
is not padded to 32), large ones coarse buckets (the step cost is then large anyway).
No torch here: the runner turns a `StepShape` into a `model.Padding`.
"""

from __future__ import annotations

from dataclasses import dataclass

KEY_BUCKET = 64  # keys per sequence are padded to a multiple of this
# The most rows a compiled CPU matmul runs on column panels (`fast_model`'s few-rows rule, where
# the measurements are) and the most logit rows `StepShape.of(..., exact=True)` leaves unpadded:
# beyond it oneDNN runs them, which keeps a primitive per row count.
FEW_ROWS_MAX = 256


def bucket(n: int, smallest: int = 2) -> int:
    """The bucket of a count n >= 1: `smallest` (2 or 1), 2, 4, 8, then multiples of 8 up
    to 256, then of 64.

    torch.compile specialises every size of 1, so a bucket of 1 means one more graph.
    Tokens and logit rows are padded to at least 2 (a second matmul row costs next to
    nothing); sequences and queries per sequence may stay 1 (`StepShape.of`), because a
    padded sequence or query row doubles the attention's key gather and scores: a batch-1
    AR step of the shipped model over 600 tokens took 2.11 ms padded and 1.87 ms unpadded
    (compiled, one thread, 2026-12-02).

    Raises:
        ValueError: n < 1, or `smallest` not 1 or 2.
    """
    if n < 1:
        raise ValueError(f"a bucketed size must be >= 1, got {n}")
    if smallest not in (1, 2):
        raise ValueError(f"smallest bucket must be 1 or 2, got {smallest}")
    if n <= 8:
        return max(smallest, 1 << (n - 1).bit_length())
    step = 8 if n <= 256 else 64
    return -(-n // step) * step


def key_bucket(n: int) -> int:
    """Keys per sequence rounded up to a multiple of `KEY_BUCKET` (n >= 1)."""
    if n < 1:
        raise ValueError(f"a bucketed size must be >= 1, got {n}")
    return -(-n // KEY_BUCKET) * KEY_BUCKET


@dataclass(frozen=True, slots=True)
class StepShape:
    """The padded sizes of one step: tokens, sequences, queries and keys per sequence, logit rows."""

    tokens: int
    batch: int
    queries: int
    keys: int
    rows: int

    @classmethod
    def of(cls, tokens: int, batch: int, queries: int, keys: int, rows: int, exact: bool = False) -> StepShape:
        """Bucket the real sizes (`rows` may be 0: a prefill chunk still gets a bucket of rows).
        Batch and queries keep a bucket of 1, so a run compiles at most four graphs: batch 1 or
        more, one query per sequence or more. The batch-1, one-query step (`ar` at batch 1) is
        one token with at most one logit row, and its graph is specialised to batch 1 and query 1
        anyway, so its tokens and rows stay 1 at no extra graph: a one-row matmul runs BLAS's
        matrix-vector kernel, which a padded second row turns into a slower matrix-matrix one
        (compiled one-slot forward over 512 cached tokens, random 29M / 158M shapes, fp32:
        14.7 / 71.7 ms padded, 10.6 / 38.9 ms with one token; docs/engine.md, "oneDNN matmuls").

        `exact`: keys and logit rows up to `FEW_ROWS_MAX` stay as they are (at least 2), and so do
        the tokens (and queries) of one sequence, for a graph that is dynamic in them and whose
        kernels take any count (a CPU graph over the engine's C++ operators, its matmuls on column
        panels or int8): padded logit rows are lm_head rows computed for nothing, padded keys attention
        work (a batch-1 `wedlm` answer of 300 numbers took 0.96-0.97x the time unpadded, same
        tokens, one graph), padded tokens rows of every matmul and queries of attention (a `wedlm`
        window whose fill rule reaches 12 slots ran as 16; docs/engine.md, "Shape buckets"). Each
        output row is computed alone in those kernels, so the real rows' values do not change."""
        b, q = bucket(batch, 1), bucket(queries, 1)
        if b == 1 and q == 1:
            return cls(1, 1, 1, key_bucket(keys), 1)
        if exact:
            # one sequence of up to FEW_ROWS_MAX tokens: its tokens, which are its queries, as well
            t = tokens if b == 1 and tokens <= FEW_ROWS_MAX else bucket(tokens)
            return cls(t, b, t if b == 1 else q, max(keys, 2),
                       max(rows, 2) if rows <= FEW_ROWS_MAX else bucket(rows))
        return cls(bucket(tokens), b, q, key_bucket(keys), bucket(max(rows, 1)))
