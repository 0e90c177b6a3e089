"""Invariant 5 (docs/invariants.md): `verified` greedy equals `ar` greedy; sampled verification
keeps the AR distribution."""

import pytest
import torch

from wedlm import SamplingParams
from wedlm.engine.decoders import verified as verified_mod
from wedlm.engine.request import Sequence

PROMPTS = [[5, 17, 99, 3], list(range(40, 63)), [77], [1, 2, 1, 2, 1, 2, 1]]


def greedy(decoding, **kw):
    return SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, decoding=decoding, **kw)


@pytest.mark.parametrize("window", [1, 3, 8])
def test_verified_greedy_equals_ar(make_llm, window):
    llm = make_llm()
    ar = llm.generate(PROMPTS, greedy("ar"))
    for tau in (0.4, 5.0):  # few drafts / a draft in every slot
        ver = llm.generate(PROMPTS, greedy("verified", wedlm_window_size=window, wedlm_entropy_threshold=tau))
        assert [o["token_ids"] for o in ver] == [o["token_ids"] for o in ar]
        for o in ver:
            assert o["stats"]["decode_forwards"] <= 20 and min(o["stats"]["commits"]) >= 1


def test_verified_in_mixed_batch_equals_ar(make_llm):
    llm = make_llm()
    ar = [llm.generate([p], greedy("ar"))[0]["token_ids"] for p in PROMPTS]
    mixed = [greedy("verified", wedlm_window_size=w) for w in (2, 5, 7, 4)] + [greedy("wedlm"), greedy("ar")]
    outs = llm.generate(PROMPTS + PROMPTS[:2], mixed)
    assert [o["token_ids"] for o in outs[:4]] == ar
    assert outs[5]["token_ids"] == ar[1]


def test_right_drafts_take_fewer_forwards(make_llm, monkeypatch):
    """With oracle drafts (the AR continuation, one wrong draft injected), output is unchanged
    and the forward count drops well below one per token."""
    llm = make_llm()
    prompt = PROMPTS[1]
    truth = llm.generate([prompt], greedy("ar"))[0]["token_ids"]
    bad_position = len(prompt) + 9

    def oracle_draft(self, seq, logits, limit, start, scores=None):
        drafts = list(truth[start - len(prompt):start - len(prompt) + max(limit, 0)])
        drafts = [(t + 1) % 250 if start + i == bad_position else t for i, t in enumerate(drafts)]
        return drafts, None

    monkeypatch.setattr(verified_mod.VerifiedDecoder, "_draft", oracle_draft)
    out = llm.generate([prompt], greedy("verified", wedlm_window_size=4))[0]
    assert out["token_ids"] == truth
    # first forward has no drafts; 3 drafts + bonus; the wrong draft costs a correction-only
    # forward and a draft-less one; the last token is capped by max_tokens
    assert out["stats"]["commits"] == [1, 4, 4, 1, 1, 4, 4, 1]


def test_speculative_sampling_rule_preserves_target_distribution():
    """One draft d ~ q, verified against p: the committed token is distributed as p."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.6, 0.1, 0.2]])
    seq = Sequence("s", [0], 1, SamplingParams(temperature=1.0), max_len=10, window_size=2)
    seq.generator = torch.Generator().manual_seed(0)
    seq.decoder_state = verified_mod.DraftState(q)
    counts = torch.zeros(4)
    n = 6000
    drafts = torch.multinomial(q[0], n, replacement=True, generator=torch.Generator().manual_seed(1))
    logits = p.log()
    for d in drafts.tolist():
        accepted, last = verified_mod._verify_sampled([d], logits, seq)
        counts[d if accepted else last] += 1
    assert (counts / n - p[0]).abs().max() < 0.03
