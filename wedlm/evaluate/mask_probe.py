"""Teacher-forced probe of a WeDLM checkpoint's mask predictions: accuracy by slot distance, calibration.

What: for a held-out answer x_1..x_n (after its chat prompt) and every probe
position p, the model sees the correct prefix x_<p followed by a window of W
[MASK] slots at logical positions p..p+W-1 (the state of a streaming window
right after a commit, paper section 5.2). Slot d predicts x_{p+d}. One forward
scores many probe positions at once: the clean sequence is followed by one
W-slot window per probe, each window attending to the clean tokens before its p
and causally to its own slots (the same visibility as the prediction stream of
training, section 4.2). Reported:

* accuracy of the argmax by slot distance d = 0..W-1 (and the AR head's
  next-token accuracy on the same answers, for reference);
* calibration of the fills the decoder would accept: of the slots whose
  distance-adjusted entropy H + lambda * d (Eq. 11, [MASK] column excluded) is
  below tau, the share whose argmax is right, bucketed by entropy;
* the end slot by how much of the answer is still masked: of the windows whose
  slot k is the answer's `<|im_end|>` (so the answer's last k tokens are masked
  before it, e.g. k = 2 for the two result digits of "71 - 31 = 40"), the share
  where that slot's argmax is the end. A decoder that fills the result and the
  end slot in one forward relies on it; k = 0 is the AR-like case.

Why: streaming decoding is exact only if accepted fills are right; a confident
wrong fill (e.g. at a digit-length change) derails everything after it. These
two numbers say where a checkpoint stands before any decoding run.

Targets beyond the answer's `<|im_end|>` are `<|im_end|>` (after the end comes
the end, as the learnable end tokens of training teach).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wedlm.engine.sampling import entropy
from wedlm.model import DenseAttention

ENTROPY_EDGES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8, float("inf"))


@dataclass(slots=True)
class ProbeResult:
    """Counts of one probe run (plain ints; `summary()` turns them into rates)."""

    window: int
    tau: float
    lam: float
    slot_right: list[int] = field(default_factory=list)  # [W] argmax right, by distance
    slot_total: list[int] = field(default_factory=list)  # [W]
    ar_right: int = 0
    ar_total: int = 0
    bucket_accepted: list[int] = field(default_factory=list)  # per entropy bucket, accepted fills
    bucket_right: list[int] = field(default_factory=list)  # of those, right
    end_right: list[int] = field(default_factory=list)  # [W] by k: the end slot at distance k is right
    end_total: list[int] = field(default_factory=list)  # [W] windows whose slot k is the answer's end

    def __post_init__(self) -> None:
        self.slot_right = self.slot_right or [0] * self.window
        self.slot_total = self.slot_total or [0] * self.window
        self.end_right = self.end_right or [0] * self.window
        self.end_total = self.end_total or [0] * self.window
        n = len(ENTROPY_EDGES) - 1
        self.bucket_accepted = self.bucket_accepted or [0] * n
        self.bucket_right = self.bucket_right or [0] * n

    def summary(self) -> dict:
        """Rates: slot_accuracy [W], ar_accuracy, accepted_right (all buckets), buckets (list of
        dicts), end_accuracy [W] (index k: answer tokens masked before the end slot; None where
        no window had its end there) with end_total [W]."""
        acc = [r / t if t else None for r, t in zip(self.slot_right, self.slot_total)]
        end_acc = [r / t if t else None for r, t in zip(self.end_right, self.end_total)]
        buckets = [{"entropy_from": ENTROPY_EDGES[i], "entropy_to": ENTROPY_EDGES[i + 1], "accepted": a,
                    "right": r, "share_right": r / a if a else None}
                   for i, (a, r) in enumerate(zip(self.bucket_accepted, self.bucket_right))]
        total_a, total_r = sum(self.bucket_accepted), sum(self.bucket_right)
        return {"window": self.window, "tau": self.tau, "lambda": self.lam, "slot_accuracy": acc,
                "slot_total": self.slot_total, "ar_accuracy": self.ar_right / max(1, self.ar_total),
                "accepted": total_a, "accepted_right": total_r / total_a if total_a else None,
                "buckets": buckets, "end_accuracy": end_acc, "end_total": self.end_total}


def probe_inputs(ids: list[int], start: int, probes: list[int], window: int, mask_id: int):
    """Input ids, positions and the bool visibility mask of one probe forward.

    Args:
        ids: the clean sequence (prompt + answer + end), length L.
        start: index of the first answer token (probes are >= start).
        probes: probe positions p (each window predicts ids[p .. p+W-1]).
        window: W.
        mask_id: the [MASK] id.

    Returns:
        (input_ids int64 [1, S], positions int64 [1, S], mask bool [1, 1, S, S]) with
        S = L + len(probes) * W; window k occupies slots L + k*W .. L + (k+1)*W - 1.
    """
    L, W = len(ids), window
    S = L + len(probes) * W
    input_ids = torch.tensor(ids + [mask_id] * (len(probes) * W))
    positions = torch.cat([torch.arange(L)] + [torch.arange(p, p + W) for p in probes])
    mask = torch.zeros(S, S, dtype=torch.bool)
    mask[:L, :L] = torch.ones(L, L, dtype=torch.bool).tril()
    causal_w = torch.ones(W, W, dtype=torch.bool).tril()
    for k, p in enumerate(probes):
        lo = L + k * W
        mask[lo:lo + W, :p] = True
        mask[lo:lo + W, lo:lo + W] = causal_w
    return input_ids[None], positions[None], mask[None, None]


@torch.no_grad()
def probe_item(model, result: ProbeResult, ids: list[int], start: int, end_id: int, mask_id: int,
               max_probes_per_forward: int = 64) -> None:
    """Add one answer's counts to `result` (every position from `start` to the first end token)."""
    W = result.window
    n_ans = ids.index(end_id, start) + 1 if end_id in ids[start:] else len(ids)
    ids = ids[:n_ans]
    targets = ids + [end_id] * W  # beyond the end comes the end
    positions_all = list(range(start, n_ans))
    for c in range(0, len(positions_all), max_probes_per_forward):
        probes = positions_all[c:c + max_probes_per_forward]
        input_ids, positions, mask = probe_inputs(ids, start, probes, W, mask_id)
        dev = model.device
        logits = model(input_ids.to(dev), positions.to(dev), DenseAttention(mask.to(dev)))[0].float()
        if c == 0:  # AR head on the clean answer: logits at i-1 predict ids[i]
            ar = logits[start - 1:n_ans - 1].argmax(-1).cpu()
            result.ar_right += int((ar == torch.tensor(ids[start:n_ans])).sum())
            result.ar_total += n_ans - start
        win = logits[len(ids):].view(len(probes), W, -1)
        win[..., mask_id] = float("-inf")
        probs = torch.softmax(win, dim=-1)
        ent = entropy(probs.view(-1, probs.shape[-1])).view(len(probs), W)  # [P, W], the decoders' entropy
        pred = probs.argmax(-1).cpu()
        gold = torch.tensor([[targets[p + d] for d in range(W)] for p in probes])
        right = pred == gold
        d = torch.arange(W, dtype=torch.float32)
        accepted = (ent.cpu() + result.lam * d) < result.tau
        for k, p in enumerate(probes):
            end_slot = n_ans - 1 - p  # the slot of this window that holds the answer's end token
            if end_slot < W and ids[-1] == end_id:
                result.end_total[end_slot] += 1
                result.end_right[end_slot] += int(right[k, end_slot])
            for dd in range(W):
                result.slot_total[dd] += 1
                result.slot_right[dd] += int(right[k, dd])
                if accepted[k, dd]:
                    b = _bucket(float(ent[k, dd]))
                    result.bucket_accepted[b] += 1
                    result.bucket_right[b] += int(right[k, dd])


def _bucket(h: float) -> int:
    for i in range(len(ENTROPY_EDGES) - 1):
        if h < ENTROPY_EDGES[i + 1]:
            return i
    return len(ENTROPY_EDGES) - 2


def probe(model, tokenizer, pairs: list[tuple[str, str]], window: int, tau: float, lam: float,
          progress: bool = True) -> dict:
    """Probe `(prompt, answer)` pairs rendered with the chat template; returns `ProbeResult.summary()`.

    Raises:
        ValueError: a checkpoint without a mask token, or window < 1.
    """
    mask_id = model.config.mask_token_id
    if mask_id is None:
        raise ValueError("mask probe needs a WeDLM checkpoint (config.mask_token_id is None)")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    end_id = end_token_id(tokenizer)
    result = ProbeResult(window, tau, lam)
    from tqdm import tqdm
    for prompt, answer in tqdm(pairs, desc=f"mask probe W={window}", disable=not progress):
        head, body = encode_pair(tokenizer, prompt, answer)
        probe_item(model, result, head + body + [end_id], len(head), end_id, mask_id)
    return result.summary()


def end_token_id(tokenizer) -> int | None:
    """The id that ends an answer: `<|im_end|>` when the vocabulary has it, else EOS (or None)."""
    return tokenizer.get_vocab().get("<|im_end|>", tokenizer.eos_token_id)


def encode_pair(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """(prompt ids through the assistant header, answer ids): the user turn rendered with the
    chat template as the engine renders a request, the answer text tokenised on its own."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return (tokenizer(text, add_special_tokens=False)["input_ids"],
            tokenizer(answer, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def end_probe(model, tokenizer, pairs: list[tuple[str, str]], threshold: float = 0.5,
              progress: bool = True) -> dict:
    """Does the AR head put the end token where the answer ends, and only there? (teacher-forced)

    What: for each `(prompt, answer)` rendered with the chat template, one causal forward over
    prompt + answer + `<|im_end|>`; p_end[i] = softmax(logits[i])[end] predicts the token after
    position i. The answer's end is the position of its last token; every other answer position
    (including the one before the answer's first token) is "early".

    Why: an answer that must stop at a value read from the prompt ("Count from 429 to 446.")
    is exact only if the model ends exactly there. A model that does not read the end value
    puts the same small p_end at the true end as after any other number; a length prior shows
    as a high p_end early. Greedy decoding stops right when p_end at the end is the argmax and
    the end token is never the argmax earlier; this probe reports the probabilities behind it.

    Args:
        pairs: (user prompt, reference answer) texts.
        threshold: an item is "decided right" when p_end at the end > threshold and every
            early p_end < threshold.

    Returns:
        {"n", "p_end_at_end_median", "p_end_at_end_mean", "p_end_early_max_median",
        "decided_right"} (shares in [0, 1]; decided_right is a share of items).

    Raises:
        ValueError: no pairs, or a tokenizer without `<|im_end|>` or an EOS token.
    """
    if not pairs:
        raise ValueError("end_probe needs at least one (prompt, answer) pair")
    end_id = end_token_id(tokenizer)
    if end_id is None:
        raise ValueError("end_probe: the tokenizer has neither <|im_end|> nor an EOS token")
    at_end, early_max, right = [], [], 0
    from tqdm import tqdm
    for prompt, answer in tqdm(pairs, desc="end probe", disable=not progress):
        head, body = encode_pair(tokenizer, prompt, answer)
        ids = torch.tensor(head + body, device=model.device)
        logits = model(ids[None], torch.arange(len(ids), device=model.device)[None], DenseAttention())[0]
        p_end = torch.softmax(logits[len(head) - 1:].float(), dim=-1)[:, end_id].cpu()  # [len(body) + 1]
        end, early = float(p_end[-1]), float(p_end[:-1].max())
        at_end.append(end)
        early_max.append(early)
        right += int(end > threshold and early < threshold)
    at_end_t, early_t = torch.tensor(at_end), torch.tensor(early_max)
    return {"n": len(pairs), "p_end_at_end_median": float(at_end_t.median()),
            "p_end_at_end_mean": float(at_end_t.mean()), "p_end_early_max_median": float(early_t.median()),
            "decided_right": right / len(pairs)}
