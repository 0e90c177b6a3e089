"""Log-probabilities of generated and prompt tokens (`SamplingParams.logprobs` / `prompt_logprobs`).

Which distribution: each committed token's logprob is log_softmax of the logits row that
chose it, after the request's logit controls (`logits_processors.py`: logit_bias, min_tokens,
penalties) and before temperature, top-k, top-p and min-p (OpenAI's convention: a token's
logprob does not depend on the sampling temperature). For greedy requests that row's argmax
is the token. Which row:

* `ar`, `verified`: the AR head's next-token row of the forward that committed it (for
  `verified`, accepted drafts and the correction or bonus alike), so both report the same
  values for the same tokens;
* `wedlm`, `blockwise`: the [MASK] slot's row of the forward that filled it (or the AR row
  that filled the leftmost mask under `wedlm_stop_by_ar`), recorded at fill time and
  reported when the slot is committed, possibly several forwards later.

The [MASK] column is -inf in every row (the runner bans it), so it never appears.
Prompt logprobs come from one teacher-forced causal forward of the whole prompt (no
controls), the AR head's log_softmax at position i - 1 for prompt token i.
"""

from __future__ import annotations

import torch

from ..model import DenseAttention
from .outputs import TokenLogprob
from .request import Sequence


def gather(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
    """`TokenLogprob` of tokens[i] under log_softmax(logits[i]) with its k most likely alternatives.

    Args:
        logits: float [n, V].
        tokens: n token ids.
        k: alternatives per token, 0..V.
    """
    if not tokens:
        return []
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, dtype=torch.int64, device=lp.device)[:, None])[:, 0].tolist()
    if k > 0:
        top = lp.topk(k, dim=-1)
        top_ids, top_lps = top.indices.tolist(), top.values.tolist()
    else:
        top_ids = top_lps = [[] for _ in tokens]
    return [TokenLogprob(t, c, tuple(zip(ids, lps))) for t, c, ids, lps in zip(tokens, chosen, top_ids, top_lps)]


def record(seq: Sequence, rows: str, logits: torch.Tensor, offsets: list[int], before: list[int | None],
           base: int, committed: list[int]) -> None:
    """Keep the logprobs of the positions this forward chose, by position, in `seq.pending_logprobs`.

    Args:
        rows: the decoder's `logprob_rows` ("commit" or "fill").
        logits: the (processed) rows the decoder read, float [n, V].
        offsets: window offset each row predicts (`Decoder.row_offsets`).
        before: the window before the update; base: len(seq.tokens) before the commit.
        committed: the decoder's committed tokens (positions base, base + 1, ...).
    """
    if rows == "commit":
        picked = list(range(len(committed)))
        tokens = list(committed)
    else:
        after = committed + list(seq.window)  # position base + i after the update
        picked, tokens = [], []
        for r, o in enumerate(offsets):
            if o < len(after) and after[o] is not None and (o >= len(before) or before[o] is None):
                picked.append(r)
                tokens.append(after[o])
    if not picked:
        return
    index = torch.tensor(picked, dtype=torch.int64, device=logits.device)
    positions = range(len(picked)) if rows == "commit" else [offsets[r] for r in picked]
    for o, value in zip(positions, gather(logits[index], tokens, seq.params.logprobs)):
        seq.pending_logprobs[base + o] = value


def take(seq: Sequence, base: int, n: int) -> list[TokenLogprob]:
    """The logprobs of the n tokens just committed at positions base.. (removed from the pending ones).

    Raises:
        KeyError: a committed position whose choosing row was not recorded (a decoder bug).
    """
    return [seq.pending_logprobs.pop(base + i) for i in range(n)]


@torch.inference_mode()
def prompt_logprobs(model, ids: list[int], k: int, mask_token_id: int | None,
                    autocast: torch.dtype | None = None) -> list[TokenLogprob | None]:
    """None, then the AR head's `TokenLogprob` of ids[i] given ids[:i] for i >= 1 (one causal forward).

    Args:
        model: the whole causal LM (`QwenForCausalLM`; not a tensor-parallel shard).
        ids: the prompt, >= 1 token.
        k: alternatives per token.
        mask_token_id: excluded before the softmax, as in decoding (None: none).
        autocast: the engine's autocast dtype, so the values use generation's arithmetic.
    """
    if len(ids) < 2:
        return [None] * len(ids)
    device = model.device
    input_ids = torch.tensor([ids[:-1]], dtype=torch.int64, device=device)
    positions = torch.arange(len(ids) - 1, device=device)[None]
    with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits = model(input_ids, positions, DenseAttention())[0].float()
    if mask_token_id is not None:
        logits[:, mask_token_id] = float("-inf")
    return [None] + gather(logits, ids[1:], k)
