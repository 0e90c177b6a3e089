"""The fill rule of Streaming Parallel Decoding (paper section 5.2, Eq. 11), shared by every decoder.

For the masks of a window, in slot order, the score of mask i is its prediction
entropy plus a distance penalty, H~_i = H_i + lambda * d_i, where d_i is its
distance in slots from the leftmost mask; a mask whose score is below tau is
confident enough to fill. `streaming` fills every such mask (with a fallback
when none passes), `verified` drafts the leading confident run; both score and
draw through the functions here. The entropy is that of the distribution the
token is drawn from (docs/method.md, "Streaming parallel decoding").

The decoders name the knobs by the paper's symbols where they implement its
equations: tau is `wedlm_entropy_threshold`, lambda `wedlm_pos_penalty_factor` and
W `wedlm_window_size` (`SamplingParams` documents the public names).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from ..sampling import RowScores, entropy, probabilities, sample
from ..sampling_params import SamplingParams


def fill_scores(logits: torch.Tensor, params: SamplingParams, distances: Seq[int],
                scores: RowScores | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities and distance-adjusted entropies of mask predictions (Eq. 11).

    Args:
        logits: float [n, V] predictions at n masks ([MASK] already -inf: the runner bans it).
        params: the request's (resolved) sampling parameters: temperature, top-k/top-p,
            `wedlm_pos_penalty_factor` (lambda).
        distances: d_i for each row, in slots from the leftmost mask (>= 0).
        scores: the same rows' softmax and entropy, computed for the whole batch at once
            (`sampling.SoftmaxRows`); used for greedy requests, whose distribution is plain
            softmax. None = compute them here from `logits` (the reference; same values).

    Returns:
        (probs float32 [n, V] under the request's sampling settings,
         adjusted float32 [n] = entropy in nats + lambda * d_i).
    """
    if scores is not None and params.greedy:
        probs, ent = scores.get()
    else:
        probs = probabilities(logits, params)
        ent = entropy(probs)
    dist = torch.tensor(list(distances), dtype=torch.float32, device=probs.device)
    return probs, ent + params.wedlm_pos_penalty_factor * dist


def below_tau(adjusted: torch.Tensor, tau: float | None) -> list[bool]:
    """adjusted[i] < tau for each row; all False when tau is None (fill by argmin only)."""
    if tau is None:
        return [False] * adjusted.shape[0]
    return (adjusted < tau).tolist()


def draw(probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    """One token id per row of probs [n, V]: the argmax when greedy, else a sample."""
    tokens = probs.argmax(-1) if params.greedy else sample(probs, generator)
    return tokens.tolist()


def draw_rows(probs: torch.Tensor, rows: list[int], params: SamplingParams, generator: torch.Generator | None,
              scores: RowScores | None = None) -> list[int]:
    """`draw(probs[rows], ...)`: one token id for each of `rows` (indices into probs [n, V], from
    `fill_scores` with the same `scores`). A greedy request with batch scores takes the argmax ids
    the batch computed for all its rows at once (`sampling.SoftmaxRows.argmax`: the same rows of
    the same probs, so the same ids) instead of gathering and reducing its own."""
    if scores is not None and params.greedy:
        ids = scores.argmax()
        return [ids[j] for j in rows]
    return draw(probs[rows], params, generator)
