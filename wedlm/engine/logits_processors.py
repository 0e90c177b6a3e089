"""The logit controls of a request: logit_bias, min_tokens, repetition / presence / frequency penalties.

They rewrite the logits of every row a decoder samples or fills from, before the
decoder computes entropy (the fill rule, paper section 5.2, Eq. 11), argmax or samples,
so every decoder honours them and the entropy of a slot is that of the distribution the
token is drawn from. Applied in this order (vLLM's order of penalties and bias):

1. logit_bias: `logits[:, id] += bias` (OpenAI);
2. min_tokens: the request's stop ids get -inf in rows whose position is before the
   min_tokens-th generated token;
3. repetition_penalty r (transformers / vLLM): for every token seen in the prompt or
   generated so far, a positive logit is divided by r, a negative one multiplied;
4. frequency_penalty f and presence_penalty p (OpenAI): `logits -= f * count + p * (count > 0)`
   over the tokens generated so far.

"Generated so far" for a row is what the token it chooses follows: the committed output
plus the filled window slots to the left of the position the row predicts (`row_offsets`
of the decoder). For `ar` and `verified` those are the committed tokens and the drafts
before it, exactly the context the AR head was fed, so `verified` stays equal to `ar`
under the same controls. All rows of a request are processed at once: the counts of
row i are the committed output's bincount plus a cumulative one-hot of the window's
fills, gathered at each row's number of fills to its left.
"""

from __future__ import annotations

import torch

from .request import Sequence


def fills_before(window: list[int | None], offsets: list[int]) -> tuple[list[int], list[int]]:
    """(the window's filled tokens in slot order, for each offset how many of them lie before it).

    Args:
        window: the decoder's window before the update (slot i at position len(tokens) + i).
        offsets: window offset each logits row predicts (0 = the token after the committed text;
            an offset past the window counts every fill).
    """
    fills, before = [], [0]
    for t in window:
        if t is not None:
            fills.append(t)
        before.append(len(fills))
    return fills, [before[min(o, len(window))] for o in offsets]


def apply_controls(seq: Sequence, logits: torch.Tensor, offsets: list[int]) -> torch.Tensor:
    """The request's logit controls applied to logits [n, V] (a new float32 tensor).

    Args:
        seq: the request (its params, committed tokens, window before the update, stop ids).
        logits: float [n, V] rows the decoder reads ([MASK] already -inf).
        offsets: the window offset each row predicts (`Decoder.row_offsets`), len n.

    Returns:
        float32 [n, V]; -inf entries stay -inf.
    """
    params = seq.params
    out = logits.float().clone()
    device, vocab = out.device, out.shape[-1]
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.int64, device=device)
        out[:, ids] += torch.tensor(list(params.logit_bias.values()), dtype=torch.float32, device=device)
    if params.min_tokens and seq.stop_ids:
        _suppress_stops(seq, out, offsets)
    if params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
        counts = _generated_counts(seq, offsets, vocab, device)  # [n, V]
        if params.repetition_penalty != 1.0:
            prompt = torch.tensor(seq.tokens[:seq.prompt_len], dtype=torch.int64, device=device)
            seen = (counts > 0) | (torch.bincount(prompt, minlength=vocab) > 0)[None]
            r = params.repetition_penalty
            out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
        if params.frequency_penalty or params.presence_penalty:
            out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return out


def _suppress_stops(seq: Sequence, out: torch.Tensor, offsets: list[int]) -> None:
    """-inf for the stop ids in rows predicting a generated position before min_tokens."""
    early = torch.tensor([seq.num_generated + o < seq.params.min_tokens for o in offsets], dtype=torch.bool,
                         device=out.device)
    stops = torch.tensor(sorted(seq.stop_ids), dtype=torch.int64, device=out.device)
    out[early[:, None] & torch.zeros_like(out, dtype=torch.bool).index_fill_(1, stops, True)] = float("-inf")


def _generated_counts(seq: Sequence, offsets: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """float32 [n, V]: per row, how often each token occurs in the output generated before its position."""
    output = torch.tensor(seq.output_ids, dtype=torch.int64, device=device)
    counts = torch.bincount(output, minlength=vocab).float()[None].repeat(len(offsets), 1)
    fills, before = fills_before(seq.window, offsets)
    if fills:
        onehot = torch.zeros(len(fills) + 1, vocab, device=device)
        onehot[torch.arange(1, len(fills) + 1, device=device),
               torch.tensor(fills, dtype=torch.int64, device=device)] = 1.0
        counts += onehot.cumsum(0)[torch.tensor(before, dtype=torch.int64, device=device)]
    return counts
