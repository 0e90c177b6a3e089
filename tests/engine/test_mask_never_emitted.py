"""[MASK] is an input symbol only: no decoder (nor the AR head) may emit it, even when the model's
logits prefer it, whether the id comes from config.json (WeDLM) or from the tokenizer (a Qwen
checkpoint whose vocabulary has a mask token): the engine has one mask id and the runner bans it."""

import pytest
import torch

from wedlm import LLM, SamplingParams


class PreferMask(torch.nn.Module):
    """Wraps the model: +50 on the [MASK] column of every logits row."""

    def __init__(self, model, mask_id):
        super().__init__()
        self.inner, self.mask_id = model, mask_id

    def hidden_states(self, *args):
        return self.inner.hidden_states(*args)

    def forward(self, *args):
        logits = self.inner(*args).clone()
        logits[:, self.mask_id] += 50.0
        return logits


@pytest.mark.parametrize("decoding", ["ar", "wedlm", "blockwise", "verified"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("wedlm", [True, False], ids=["wedlm-config", "qwen-tokenizer"])
def test_mask_token_never_committed(ckpt_factory, decoding, temperature, wedlm):
    path = ckpt_factory(f"engine_mask_pref_{wedlm}", family="qwen3", wedlm=wedlm, tokenizer=True, seed=5)
    llm = LLM(str(path), kv_block_size=4, wedlm_window_size=4, device="cpu")
    runner = llm.engine.runner
    mask_id = llm.engine.mask_token_id
    assert mask_id == 255 and runner.mask_token_id == mask_id
    assert llm.tokenizer.convert_ids_to_tokens(mask_id) == "<|mask|>"
    runner.model = PreferMask(runner.model, mask_id)
    params = SamplingParams(temperature=temperature, max_tokens=12, decoding=decoding,
                            ignore_eos=True, seed=1)
    out = llm.generate([[5, 6, 7]], params)[0]
    assert len(out["token_ids"]) == 12
    assert mask_id not in out["token_ids"]
