"""Teacher-forced log-likelihood: packed shared-context rows equal one plain causal forward per pair,
[MASK] is excluded, truncation and rolling windows score every token exactly once."""

import pytest
import torch

from wedlm.evaluate.loglikelihood import (
    ScoreRequest,
    batch_rows,
    pack_requests,
    rolling_requests,
    score_requests,
    sum_rolling,
    truncate,
)
from wedlm.model import DenseAttention, load_model


@pytest.fixture(scope="module")
def model(ckpt_factory):
    torch.set_num_threads(1)
    return load_model(ckpt_factory("ll-wedlm", wedlm=True, tokenizer=True, vocab_size=260), dtype="float32")


def direct(model, context, continuation, mask_id=None):
    """log P(continuation | context) and greedy flag from one unpacked causal forward."""
    ids = list(context) + list(continuation[:-1])
    x = torch.tensor([ids])
    logits = model(x, torch.arange(len(ids))[None], DenseAttention(is_causal=True))[0].float()
    if mask_id is not None:
        logits[:, mask_id] = float("-inf")
    lp = torch.log_softmax(logits, -1)[len(context) - 1:]
    target = torch.tensor(continuation)
    return lp.gather(1, target[:, None]).sum().item(), bool((lp.argmax(-1) == target).all())


def test_packed_rows_equal_direct_computation(model):
    ctx_a, ctx_b = (5, 17, 33, 80, 81), (9, 100)
    requests = [ScoreRequest(ctx_a, (40,)), ScoreRequest(ctx_a, (41, 42, 43)), ScoreRequest(ctx_b, (7, 8)),
                ScoreRequest(ctx_a, (200, 201)), ScoreRequest(ctx_b, (7, 8)), ScoreRequest((3,), (4, 5, 6, 7))]
    got = score_requests(model, requests, max_len=64, max_batch_tokens=20, mask_token_id=259)
    for req, res in zip(requests, got):
        want_lp, want_greedy = direct(model, req.context, req.continuation, mask_id=259)
        assert res.logprob == pytest.approx(want_lp, abs=1e-4)
        assert res.is_greedy == want_greedy and res.num_tokens == len(req.continuation)
    assert got[2] == got[4]  # the duplicate is scored once and mapped back


def test_one_row_per_shared_context_and_batches_under_budget():
    ctx = tuple(range(10))
    requests = [ScoreRequest(ctx, (1, 2, 3)), ScoreRequest(ctx, (4, 5)), ScoreRequest((7, 8), (9,))]
    rows = pack_requests(requests, max_len=64)
    assert [(r.context, [i for i, _ in r.members], r.length) for r in rows] == [
        (ctx, [0, 1], 10 + 2 + 1), ((7, 8), [2], 2)]
    assert [len(b) for b in batch_rows(rows, max_batch_tokens=13)] == [1, 1]
    assert [len(b) for b in batch_rows(rows, max_batch_tokens=26)] == [2]
    split = pack_requests(requests, max_len=12)  # the two continuations no longer fit one row
    assert sorted(r.length for r in split if r.context == ctx) == [11, 12]


def test_greedy_continuation_is_flagged_greedy(model):
    ids = [10, 20, 30]
    for _ in range(4):  # extend greedily with the AR head
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], DenseAttention())[0, -1]
        logits[259] = float("-inf")
        ids.append(int(logits.argmax()))
    greedy_cont = tuple(ids[3:])
    other = (greedy_cont[0] + 1) % 259, *greedy_cont[1:]
    res = score_requests(model, [ScoreRequest((10, 20, 30), greedy_cont), ScoreRequest((10, 20, 30), other)],
                         max_len=64, mask_token_id=259)
    assert res[0].is_greedy and not res[1].is_greedy
    assert res[0].logprob > res[1].logprob


def test_mask_column_is_excluded(model):
    with_mask = score_requests(model, [ScoreRequest((1, 2), (259,))], max_len=64, mask_token_id=None)[0]
    banned = score_requests(model, [ScoreRequest((1, 2), (259,))], max_len=64, mask_token_id=259)[0]
    assert with_mask.logprob > -1e9 and banned.logprob == float("-inf")


def test_truncation_keeps_the_continuation_and_fills_max_len():
    req = truncate(ScoreRequest(tuple(range(20)), (50, 51, 52)), max_len=8)
    assert req.context == (14, 15, 16, 17, 18, 19) and len(req.context) + 3 - 1 == 8
    with pytest.raises(ValueError, match="max_model_len=2"):
        truncate(ScoreRequest((1,), (2, 3, 4)), max_len=2)
    with pytest.raises(ValueError, match="context must have at least 1 token"):
        ScoreRequest((), (1,))


def test_rolling_windows_score_each_token_once_with_full_context(model):
    tokens = list(range(30, 53))  # 23 tokens
    windows = rolling_requests(tokens, prefix_token=0, max_len=8)
    assert [list(w.continuation) for w in windows] == [tokens[0:8], tokens[8:16], tokens[16:23]]
    assert windows[0].context == (0,)
    assert all(len(w.context) + len(w.continuation) - 1 == 8 for w in windows)
    assert windows[1].context == (tokens[7],) and windows[2].context == tuple(tokens[14:16])
    total = sum_rolling(score_requests(model, windows, max_len=8, mask_token_id=259))
    parts = [direct(model, w.context, w.continuation, 259)[0] for w in windows]
    assert total == pytest.approx(sum(parts), abs=1e-3)
