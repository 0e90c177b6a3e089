"""Token sampling and prediction entropy: greedy, temperature, top-k, top-p, per-request RNG.

All functions are tensor-in, tensor-out on the logits' device. A request's
`torch.Generator` makes its samples depend only on its own seed, never on
batch composition. The distribution used for sampling is also the one whose
entropy drives WeDLM's fill rule (paper section 5.2, Eq. 11): softmax(logits)
for greedy requests, the temperature/top-k/top-p-processed one otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator on `device` seeded with `seed` (per request; any integer, taken modulo 2**64)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) % (1 << 64))
    return gen


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 probs [n, V] from logits [n, V] under the request's temperature/top-k/top-p/min-p
    (applied in that order).

    Greedy requests (temperature 0 or top_p 0) get plain softmax(logits).
    """
    logits = logits.float()
    if params.greedy:
        return torch.softmax(logits, dim=-1)
    # Shift by the row max first and keep T a normal float32: the top logit becomes 0, so
    # even a tiny temperature gives 0 / T = 0 and -x / T -> -inf (a one-hot softmax), never NaN.
    temperature = max(params.temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0:
        probs = _min_p(probs, params.min_p)
    return probs


def _min_p(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens less likely than min_p times the row's most likely one; renormalise."""
    floor = min_p * probs.max(dim=-1, keepdim=True).values
    kept = probs.masked_fill(probs < floor, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise.

    The most likely token is always kept, so top_p = 0 leaves exactly one token per row.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
    drop = before >= top_p
    drop[..., 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """int64 [n]: one draw per row of probs [n, V]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
           argmax: list[int] | None = None) -> tuple[list[int], torch.Tensor | None]:
    """Pick one token per row of logits [n, V].

    Returns the token ids and, for sampled requests, the probs [n, V] they were
    drawn from (None for greedy). `argmax` may pass precomputed greedy ids.
    """
    if params.greedy:
        return (argmax if argmax is not None else logits.argmax(-1).tolist()), None
    probs = probabilities(logits, params)
    return sample(probs, generator).tolist(), probs


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """float32 [n]: Shannon entropy (nats) of each row of probs [n, V].

    -sum p * log(max(p, 1e-30)), with the log and product computed in place in one
    temporary (the same kernels and values as the out-of-place form, one [n, V] buffer).
    """
    terms = probs.clamp_min(1e-30).log_().mul_(probs)
    return -terms.sum(dim=-1)


class SoftmaxRows:
    """softmax(logits) and its entropy for every logit row of one forward, computed once for
    the whole batch on first use: the greedy fill scores of all windows at once (Eq. 11).

    Args:
        logits: float [num_rows, V] of the forward (already [MASK]-banned).
        estimate: also take every row's entropy and argmax from `wedlm_cpu.greedy_scores` (the
            engine's C++ operators loaded, float32 CPU logits): two passes over the logits
            instead of torch's six, with the entropy within ~2e-6 + 6e-6 H nats of the exact
            one (`estimate`), and the argmax ids equal to the exact ones (rows it cannot vouch for
            are computed exactly).
    """

    # logits within this of a row's maximum could round to its softmax probability: such rows'
    # argmax comes from the probabilities (csrc/greedy_scores.cpp)
    TIE = 1e-5

    def __init__(self, logits: torch.Tensor, estimate: bool = False) -> None:
        self.logits = logits
        self._probs: torch.Tensor | None = None
        self._entropy: torch.Tensor | None = None
        self._argmax: list[int] | None = None
        self._estimate: list[float] | None = None
        # computed on first use, like the rest: an `ar` batch never asks
        self._estimable = estimate and logits.dtype == torch.float32 and logits.device.type == "cpu"

    def _estimate_all(self) -> None:
        self._estimable = False
        entropy_t, argmax_t = torch.ops.wedlm_cpu.greedy_scores(self.logits, self.TIE)
        self._estimate = entropy_t.tolist()
        ids = argmax_t.tolist()
        if -1 not in ids:
            self._argmax = ids

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 probs [stop - start, V], float32 entropy [stop - start]) of rows start..stop-1."""
        if self._probs is None:
            self._probs = torch.softmax(self.logits.float(), dim=-1)
            self._entropy = entropy(self._probs)
        return self._probs[start:stop], self._entropy[start:stop]

    def argmax(self, start: int, stop: int) -> list[int]:
        """The argmax ids of the probs rows start..stop-1 (the greedy draws), computed for every
        row at once on first use: one op and one host copy per step, not three per window."""
        if self._estimable:
            self._estimate_all()
        if self._argmax is None:
            self._argmax = self.rows(0, self.logits.shape[0])[0].argmax(-1).tolist()
        return self._argmax[start:stop]

    def estimate(self, start: int, stop: int) -> list[float] | None:
        """Entropies (nats) of rows start..stop-1 within ~2e-6 + 6e-6 H of `rows`'
        (csrc/greedy_scores.cpp derives both sides' bounds; NaN for a row with a NaN or no finite
        logit), or None when this batch has no estimate."""
        if self._estimable:
            self._estimate_all()
        return None if self._estimate is None else self._estimate[start:stop]


@dataclass(frozen=True)
class RowScores:
    """One item's rows start..stop-1 of a `SoftmaxRows`; slicing gives a sub-range (step 1)."""

    batch: SoftmaxRows
    start: int
    stop: int

    def __getitem__(self, index: slice) -> RowScores:
        sub = range(self.start, self.stop)[index]
        return RowScores(self.batch, sub.start, max(sub.start, sub.stop))

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(probs [n, V], entropy [n]) of plain softmax: the greedy distribution of these rows."""
        return self.batch.rows(self.start, self.stop)

    def argmax(self) -> list[int]:
        """The argmax id of each of these rows' probs (`get`): their greedy draws."""
        return self.batch.argmax(self.start, self.stop)

    def estimate(self) -> list[float] | None:
        """These rows' entropies within ~2e-6 + 6e-6 H nats of `get`'s, or None
        (`SoftmaxRows.estimate`)."""
        return self.batch.estimate(self.start, self.stop)
