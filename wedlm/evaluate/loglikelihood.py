"""Log-likelihood of continuations from the AR head, by teacher forcing (exact and batched).

What: `score_requests(model, requests)` returns, for each (context, continuation)
pair of token ids, log P(continuation | context) = sum over its tokens of the
log-softmax at the row before each token, and whether greedy decoding would
have produced every token. `rolling_requests` cuts a whole document into
such pairs for perplexity (lm-evaluation-harness's `loglikelihood_rolling`).

How: requests that share a context are packed into one row, the context once
and each continuation after it; a boolean mask lets each continuation see the
context and itself only, and each continuation's positions restart at the
context length. So a multiple-choice question with four answers costs one
context prefill instead of four, and the result is the same as scoring each
pair alone in its own causal forward (a test pins it). Rows are batched under
a token budget and logits are computed only at the scored rows.

Which distribution: the logits of an ordinary token at position p predict the
token at p+1 (the AR head; docs/method.md, "The model and its checkpoint"). For a WeDLM checkpoint the
[MASK] column is excluded before the softmax, as in every decoder of the
engine, so these are the probabilities of the distribution greedy and sampled
decoding draw from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from wedlm.model import DenseAttention


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """One pair to score: `context` (>= 1 token) and the `continuation` whose log-probability is wanted."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.context:
            raise ValueError("context must have at least 1 token (prepend a BOS/EOS id for empty contexts)")
        if not self.continuation:
            raise ValueError("continuation must have at least 1 token")


@dataclass(slots=True)
class ScoreResult:
    """log P(continuation | context) in nats, whether greedy decoding reproduces it, its token count."""

    logprob: float
    is_greedy: bool
    num_tokens: int


@dataclass(slots=True)
class PackedRow:
    """One row of a scoring forward: a context, then each continuation's fed tokens.

    Attributes:
        context: context ids (fed at positions 0..len-1).
        members: (request index, continuation ids); a continuation of m tokens feeds its
            first m-1 tokens at positions len(context)..len(context)+m-2.
    """

    context: tuple[int, ...]
    members: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens this row feeds."""
        return len(self.context) + sum(len(c) - 1 for _, c in self.members)


def truncate(req: ScoreRequest, max_len: int) -> ScoreRequest:
    """`req` with its context cut from the left so that at most `max_len` tokens are fed.

    Raises:
        ValueError: the continuation alone needs more than `max_len` fed tokens.
    """
    if len(req.continuation) > max_len:
        raise ValueError(f"continuation has {len(req.continuation)} tokens; at most max_model_len={max_len} "
                         "can be scored in one forward")
    keep = max_len - len(req.continuation) + 1
    return req if len(req.context) <= keep else ScoreRequest(req.context[-keep:], req.continuation)


def pack_requests(requests: Sequence[ScoreRequest], max_len: int) -> list[PackedRow]:
    """Rows of at most `max_len` fed tokens; continuations of one context share its row.

    Identical (context, continuation) pairs appear once (the caller maps results back).
    Rows come longest first so that batches pad little.
    """
    groups: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
    seen: set[ScoreRequest] = set()
    for i, req in enumerate(requests):
        if req in seen:
            continue
        seen.add(req)
        groups.setdefault(req.context, []).append((i, req.continuation))
    rows: list[PackedRow] = []
    for context, members in groups.items():
        row = PackedRow(context)
        for index, cont in members:
            if row.members and row.length + len(cont) - 1 > max_len:
                rows.append(row)
                row = PackedRow(context)
            row.members.append((index, cont))
        rows.append(row)
    rows.sort(key=lambda r: r.length, reverse=True)
    return rows


def batch_rows(rows: list[PackedRow], max_batch_tokens: int) -> list[list[PackedRow]]:
    """Consecutive rows grouped so that rows x longest row <= `max_batch_tokens` (one row at least)."""
    batches: list[list[PackedRow]] = []
    for row in rows:
        if batches and (len(batches[-1]) + 1) * batches[-1][0].length <= max_batch_tokens:
            batches[-1].append(row)
        else:
            batches.append([row])
    return batches


def _row_layout(row: PackedRow) -> tuple[list[int], list[int], list[int], list[tuple[int, list[int], list[int]]]]:
    """ids, positions, segment ids (0 = context, k = k-th continuation) and, per member,
    (request index, rows whose logits score it, its target ids)."""
    c = len(row.context)
    ids, pos, seg = list(row.context), list(range(c)), [0] * c
    scored = []
    for k, (index, cont) in enumerate(row.members, start=1):
        start = len(ids)
        fed = list(cont[:-1])
        ids += fed
        pos += range(c, c + len(fed))
        seg += [k] * len(fed)
        scored.append((index, [c - 1] + list(range(start, start + len(fed))), list(cont)))
    return ids, pos, seg, scored


def _batch_tensors(batch: list[PackedRow], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """input_ids / positions int64 [B, L], visibility bool [B, 1, L, L] and the scored rows (flat indices)."""
    width = batch[0].length
    ids = torch.zeros(len(batch), width, dtype=torch.int64)
    pos = torch.zeros(len(batch), width, dtype=torch.int64)
    seg = torch.full((len(batch), width), -1, dtype=torch.int64)  # -1 = padding
    scored = []
    for b, row in enumerate(batch):
        r_ids, r_pos, r_seg, r_scored = _row_layout(row)
        n = len(r_ids)
        ids[b, :n], pos[b, :n], seg[b, :n] = torch.tensor(r_ids), torch.tensor(r_pos), torch.tensor(r_seg)
        scored += [(index, [b * width + r for r in rows], targets) for index, rows, targets in r_scored]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])  # [B, L(query), L(key)]
    visible = causal & same & (seg[:, :, None] >= 0)
    visible |= torch.eye(width, dtype=torch.bool) & (seg[:, :, None] < 0)  # padding sees itself (no NaN rows)
    return ids.to(device), pos.to(device), visible[:, None].to(device), scored


@torch.inference_mode()
def score_requests(model, requests: Sequence[ScoreRequest], max_len: int, max_batch_tokens: int = 4096,
                   mask_token_id: int | None = None, progress: bool = False,
                   autocast: torch.dtype | None = None) -> list[ScoreResult]:
    """log P(continuation | context) for every request, in input order.

    Args:
        model: a `QwenForCausalLM` (any object with its `forward(ids, positions, attn,
            logits_indices)` and `device`).
        requests: the pairs; contexts longer than fits are cut from the left (`truncate`).
        max_len: most tokens fed per row (the engine's max_model_len).
        max_batch_tokens: rows x padded length per forward.
        mask_token_id: a vocabulary column excluded before the softmax (WeDLM's [MASK]), or None.
        progress: show a progress bar over forwards.
        autocast: run the forward under `torch.autocast` with this dtype (the engine's
            `runner.autocast`, so scores use the arithmetic generation uses); None = off.

    Returns:
        one `ScoreResult` per request: the summed log-probability (nats, float64 sum of
        float32 log-softmax values), `is_greedy` (every token is the argmax), token count.

    Raises:
        ValueError: a continuation longer than `max_len`, or `max_batch_tokens` < 1.
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    requests = [truncate(r, max_len) for r in requests]
    results: dict[int, ScoreResult] = {}
    batches = batch_rows(pack_requests(requests, max_len), max_batch_tokens)
    for batch in tqdm(batches, desc="loglikelihood", unit="forward", disable=not progress):
        ids, pos, visible, scored = _batch_tensors(batch, model.device)
        flat_rows = torch.tensor([r for _, rows, _ in scored for r in rows], dtype=torch.int64, device=model.device)
        with torch.autocast(model.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            logits = model(ids, pos, DenseAttention(mask=visible), flat_rows).float()  # [n_rows, vocab]
        if mask_token_id is not None:
            logits[:, mask_token_id] = float("-inf")
        logprobs = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor([t for _, _, tg in scored for t in tg], dtype=torch.int64, device=model.device)
        token_lp = logprobs.gather(1, targets[:, None])[:, 0].double().tolist()
        greedy = (logprobs.argmax(-1) == targets).tolist()
        start = 0
        for index, _, tg in scored:
            end = start + len(tg)
            results[index] = ScoreResult(sum(token_lp[start:end]), all(greedy[start:end]), len(tg))
            start = end
    first = {}
    for i, req in enumerate(requests):
        first.setdefault(req, i)
    return [results[first[req]] for req in requests]


def rolling_requests(tokens: Sequence[int], prefix_token: int, max_len: int) -> list[ScoreRequest]:
    """Disjoint windows that score every token of a document once, each with as much context as fits.

    The first window is conditioned on `prefix_token` (BOS or EOS); every later one on the
    tokens before it, so that context + continuation fill `max_len` fed tokens. Summing
    the windows' log-probabilities gives log P(document | prefix_token).
    """
    out: list[ScoreRequest] = []
    tokens = list(tokens)
    done = 0
    while done < len(tokens):
        if done == 0:
            take = min(max_len, len(tokens))
            out.append(ScoreRequest((prefix_token,), tuple(tokens[:take])))
        else:
            take = min(max_len, len(tokens) - done)
            context_start = max(0, done + take - 1 - max_len)  # fed: context + take - 1 = max_len
            out.append(ScoreRequest(tuple(tokens[context_start:done]), tuple(tokens[done:done + take])))
        done += take
    return out


def sum_rolling(results: Iterable[ScoreResult]) -> float:
    """log P(document) from the results of its `rolling_requests`."""
    return float(sum(r.logprob for r in results))
