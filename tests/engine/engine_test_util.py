"""Helpers shared by the engine's test modules."""

from wedlm.engine import runner as runner_module
from wedlm.engine.buckets import StepShape, bucket
from wedlm.engine.runner import ForwardItem


def window_logits_unpadded_and_padded(runner, monkeypatch, n: int, ctx: int):
    """(logits as the runner runs a window of `n` tokens of one sequence after `ctx` cached rows,
    the same window's logits padded to its token bucket), the real rows of each: float32
    [n - 1, vocab]. Asserts that the first ran unpadded and the second padded."""
    item = ForwardItem([(7 * j) % 50 + 4 for j in range(n)], list(range(ctx, ctx + n)), list(range(40)), ctx,
                       list(range(n - 1)))
    exact = runner.prepare([item])
    assert exact.input_ids.shape[0] == n
    got = runner.execute([item], exact)[0].logits.clone()
    with monkeypatch.context() as m:
        m.setattr(runner_module.StepShape, "of", classmethod(
            lambda cls, tokens, batch, queries, keys, rows, exact=False:
            StepShape(bucket(tokens), 1, bucket(tokens), max(keys, 2), max(rows, 2))))
        padded = runner.prepare([item])
        assert padded.input_ids.shape[0] == bucket(n) > n
        want = runner.execute([item], padded)[0].logits.clone()
    return got, want
