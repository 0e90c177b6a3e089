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

import math
from collections.abc import Sequence as Seq

import torch

from ..sampling import RowScores, entropy, probabilities, sample
from ..sampling_params import SamplingParams

# An entropy estimate (`sampling.SoftmaxRows.estimate`) and the exact float32 entropy are each
# within ~1e-6 + 3e-6 * H nats of the true value (csrc/greedy_scores.cpp). The estimate decides a
# fill only where every adjusted score is farther from tau than this tolerance (`math.isclose`'s
# rule) and, when the argmin may be asked for, the smallest is farther than twice it from every
# other score: the decisions are then those of the exact scores. Otherwise the exact path runs.
ENTROPY_RTOL, ENTROPY_ATOL = 2e-5, 1e-5


def fill_scores(logits: torch.Tensor, params: SamplingParams, distances: Seq[int],
                scores: RowScores | None = None) -> tuple[torch.Tensor | None, torch.Tensor | list[float]]:
    """Probabilities and distance-adjusted entropies of mask predictions (Eq. 11).

    Args:
        logits: float [n, V] predictions at n masks ([MASK] already -inf: the runner bans it).
        params: the request's (resolved) sampling parameters: temperature, top-k/top-p,
            `wedlm_pos_penalty_factor` (lambda), tau and the fallback.
        distances: d_i for each row, in slots from the leftmost mask (>= 0).
        scores: the same rows' softmax and entropy, computed for the whole batch at once
            (`sampling.SoftmaxRows`); used for greedy requests, whose distribution is plain
            softmax. None = compute them here from `logits` (the reference; same values).

    Returns:
        (probs float32 [n, V] under the request's sampling settings, or None for a greedy
         request whose `scores` estimate decides (its draws are `scores.argmax()`),
         adjusted float32 [n] = entropy in nats + lambda * d_i, or those n scores from the
         estimate as a list). Every decision the callers take from `adjusted` (`below_tau`,
         `argmin`) is that of the exact scores.
    """
    lam = params.wedlm_pos_penalty_factor
    if scores is not None and params.greedy:
        estimate = scores.estimate()
        if estimate is not None:
            adjusted = [h + lam * d for h, d in zip(estimate, distances)]
            if _decides(adjusted, params):
                return None, adjusted
        probs, ent = scores.get()
    else:
        probs = probabilities(logits, params)
        ent = entropy(probs)
    dist = torch.tensor(list(distances), dtype=torch.float32, device=probs.device)
    return probs, ent + lam * dist


def fill_reach(params: SamplingParams) -> int | None:
    """The farthest distance d (in slots from the leftmost mask) at which a mask can be filled
    this step by the rule of Eq. 11 (paper section 5.2), or None when any can. With tau set, the
    leftmost fallback and lambda > 0, a mask whose penalty alone exceeds tau by more than the
    entropy tolerance (lambda * d - tau > `ENTROPY_ATOL` + `ENTROPY_RTOL` * |tau|) never scores
    below tau: its entropy is >= 0. Its row then changes no decision, and since masks are fed
    after every filled slot in ascending position (section 4.1), dropping it from the forward
    changes no other row's logits under the causal mask: the same operations on the same values,
    though a kernel whose blocking follows the row count may round them differently, as batching
    does (a compiled CPU step crossing `fast_model.FEW_ROWS_MAX` rows, GPU GEMMs).

    The argmin fallback (or tau = None) may pick any mask, and tau = inf passes every one: no
    bound (nor where tau / lambda overflows a float, e.g. lambda = 1e-320). Never raises."""
    tau, lam = params.wedlm_entropy_threshold, params.wedlm_pos_penalty_factor
    if tau is None or params.wedlm_fallback != "leftmost" or lam <= 0:
        return None
    reach = (tau + ENTROPY_ATOL + ENTROPY_RTOL * abs(tau)) / lam
    return max(0, math.floor(reach)) if math.isfinite(reach) else None


def _decides(adjusted: list[float], params: SamplingParams) -> bool:
    """Whether the exact scores take the decisions these do (`ENTROPY_RTOL`, `ENTROPY_ATOL`):
    each farther than the tolerance from tau, and, when none passes and the fill may take the
    argmin, the smallest farther than twice the tolerance from every other. A NaN never decides."""
    if any(a != a for a in adjusted):
        return False
    tau = params.wedlm_entropy_threshold
    if tau is not None:
        if any(math.isclose(a, tau, rel_tol=ENTROPY_RTOL, abs_tol=ENTROPY_ATOL) for a in adjusted):
            return False
        if params.wedlm_fallback == "leftmost" or any(a < tau for a in adjusted):
            return True
    low = min(adjusted, default=0.0)
    return sum(math.isclose(a, low, rel_tol=2 * ENTROPY_RTOL, abs_tol=2 * ENTROPY_ATOL) for a in adjusted) == 1


def below_tau(adjusted: torch.Tensor | list[float], tau: float | None) -> list[bool]:
    """adjusted[i] < tau for each row (`fill_scores`' scores); all False when tau is None (fill by
    argmin only)."""
    if tau is None:
        return [False] * len(adjusted)
    if isinstance(adjusted, list):
        return [a < tau for a in adjusted]
    return (adjusted < tau).tolist()


def argmin(adjusted: torch.Tensor | list[float]) -> int:
    """The first row of the smallest score (`fill_scores`' scores)."""
    if isinstance(adjusted, list):
        return adjusted.index(min(adjusted))
    return int(adjusted.argmin())


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
