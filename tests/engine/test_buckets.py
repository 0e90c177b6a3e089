"""Shape buckets of the compiled forward (`wedlm/engine/buckets.py`)."""

import pytest

from wedlm.engine.buckets import StepShape, bucket, key_bucket


def test_bucket_values():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 250, 257, 300)] == \
        [2, 2, 4, 8, 8, 16, 16, 24, 256, 320, 320]
    assert [bucket(n, smallest=1) for n in (1, 2, 3, 9)] == [1, 2, 4, 16]
    assert [key_bucket(n) for n in (1, 64, 65, 512, 513)] == [64, 64, 128, 512, 576]
    with pytest.raises(ValueError, match="must be >= 1"):
        bucket(0)
    with pytest.raises(ValueError, match="smallest bucket must be 1 or 2, got 3"):
        bucket(5, smallest=3)


def test_step_shape():
    shape = StepShape.of(tokens=17, batch=1, queries=17, keys=530, rows=0)
    assert shape == StepShape(tokens=24, batch=1, queries=24, keys=576, rows=2)
    # batch 1, one query: one token and one row (the graph is specialised to batch and query 1 anyway)
    assert StepShape.of(tokens=1, batch=1, queries=1, keys=1, rows=1) == StepShape(1, 1, 1, 64, 1)
    assert StepShape.of(tokens=1, batch=1, queries=1, keys=600, rows=0) == StepShape(1, 1, 1, 640, 1)
    assert StepShape.of(tokens=2, batch=2, queries=1, keys=1, rows=2) == StepShape(2, 2, 1, 64, 2)
    assert StepShape.of(tokens=3, batch=3, queries=1, keys=70, rows=3) == StepShape(4, 4, 1, 128, 4)


def test_step_shape_exact_keys_and_rows():
    """`exact` (a CPU graph on column panels): keys and logit rows as they are, at least 2; rows past
    FEW_ROWS_MAX are bucketed as before; one sequence's tokens (its queries) as they are up to
    FEW_ROWS_MAX; several sequences' tokens, batch and queries, and the one-token step, as before."""
    from wedlm.engine.buckets import FEW_ROWS_MAX

    assert StepShape.of(16, 1, 16, 150, 13, exact=True) == StepShape(16, 1, 16, 150, 13)
    assert StepShape.of(17, 1, 17, 530, 0, exact=True) == StepShape(17, 1, 17, 530, 2)
    assert StepShape.of(12, 1, 12, 90, 11, exact=True) == StepShape(12, 1, 12, 90, 11)
    assert StepShape.of(FEW_ROWS_MAX, 1, FEW_ROWS_MAX, 300, 1, exact=True).tokens == FEW_ROWS_MAX
    assert StepShape.of(FEW_ROWS_MAX + 1, 1, FEW_ROWS_MAX + 1, 300, 1, exact=True) == StepShape(320, 1, 320, 300, 2)
    assert StepShape.of(12, 2, 6, 90, 2, exact=True) == StepShape(16, 2, 8, 90, 2)
    assert StepShape.of(2, 2, 1, 1, 1, exact=True) == StepShape(2, 2, 1, 2, 2)
    assert StepShape.of(300, 30, 10, 700, FEW_ROWS_MAX, exact=True).rows == FEW_ROWS_MAX
    assert StepShape.of(300, 30, 10, 700, FEW_ROWS_MAX + 1, exact=True).rows == 320
    assert StepShape.of(1, 1, 1, 600, 1, exact=True) == StepShape.of(1, 1, 1, 600, 1) == StepShape(1, 1, 1, 640, 1)
