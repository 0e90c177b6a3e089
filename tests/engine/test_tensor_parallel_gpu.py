"""Tensor parallelism over NCCL: 2 GPUs give one GPU's logits and greedy tokens (skipped without 2 GPUs).

The same code and checks as the CPU/gloo tests in test_tensor_parallel.py, on
cuda:0 and cuda:1 in float32 (tolerance 1e-4: cuBLAS may order the sums of a
split matmul differently).
"""

from __future__ import annotations

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.runner import ForwardItem

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

DECODERS = ["ar", "wedlm", "blockwise", "verified"]
BATCH = [[(13 * i + 5 * j) % 250 for j in range(n)] for i, n in enumerate([3, 17, 1, 9, 30, 5, 12, 2])]
ENGINE = dict(kv_block_size=4, wedlm_window_size=4, num_kv_blocks=24, device="cuda:0", dtype="float32")


@pytest.mark.parametrize("family, extra", [("qwen3", {}), ("qwen2", dict(tie_word_embeddings=True))])
def test_two_gpus_match_one_gpu(ckpt_factory, family, extra):
    path = str(ckpt_factory(f"tp_gpu_{family}", family=family, wedlm=True, tokenizer=True, seed=0, **extra))
    ref = LLM(path, **ENGINE)
    with LLM(path, tensor_parallel_size=2, **ENGINE) as tp:
        items = [ForwardItem(BATCH[1], list(range(17)), [0, 1, 2, 3, 4], 0, list(range(17)))]
        for a, b in zip(ref.engine.runner.run(items), tp.engine.runner.run(items)):
            torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        mixed = [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, decoding=d) for d in DECODERS] * 2
        want = [o["token_ids"] for o in ref.generate(BATCH, mixed)]
        assert [o["token_ids"] for o in tp.generate(BATCH, mixed)] == want
