"""The compiled forward on CUDA (inductor + CUDA graphs of decode steps) gives the eager tokens
(skipped without CUDA; run by scripts/gpu_check.sh)."""

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.defaults import DECODERS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [[(13 * i + 5 * j) % 250 for j in range(n)] for i, n in enumerate([3, 17, 1, 9, 30, 5, 12, 2])]


def test_cuda_compiled_and_graphed_same_tokens_as_eager(tiny_wedlm):
    kwargs = dict(kv_block_size=4, wedlm_window_size=4, device="cuda", dtype="float32")
    eager, compiled = LLM(str(tiny_wedlm), **kwargs), LLM(str(tiny_wedlm), enforce_eager=False, **kwargs)
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, decoding=d) for d in DECODERS] * 2
    want = [o["token_ids"] for o in eager.generate(PROMPTS, params)]
    assert [o["token_ids"] for o in compiled.generate(PROMPTS, params)] == want
    for p, d in zip(PROMPTS, DECODERS):  # batch 1: decode steps replay CUDA graphs
        one = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, decoding=d)
        assert compiled.generate([p], one)[0]["token_ids"] == eager.generate([p], one)[0]["token_ids"]
    assert compiled.engine.runner.compiled.graphs >= 1
