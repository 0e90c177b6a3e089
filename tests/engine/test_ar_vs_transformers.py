"""Invariant 4 (docs/invariants.md): engine `ar` greedy equals transformers
`generate(do_sample=False)` token for token."""

import pytest
import torch

from wedlm import SamplingParams

PROMPTS = [[5, 17, 99, 3], [200, 1, 1, 1, 42, 42, 7, 8, 9, 10, 11], [77]]


def hf_greedy(path, prompt, n):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=0,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_ar_greedy_equals_transformers(ckpt_factory, family):
    from wedlm import LLM

    path = ckpt_factory(f"engine_ar_{family}", family=family, tokenizer=True, seed=3)
    llm = LLM(str(path), kv_block_size=4, device="cpu")
    params = SamplingParams(temperature=0, max_tokens=24, decoding="ar", ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        expected = hf_greedy(path, prompt, 24)
        assert out["token_ids"] == expected
        assert out["finish_reason"] == "length"
        assert out["stats"]["decode_forwards"] == 24
        assert out["stats"]["p_cache"] == 1.0
    assert llm.metrics()["kv_blocks_free"] == llm.metrics()["kv_blocks_total"]
