"""Tensor parallelism on Llama-style checkpoints (CPU, gloo, 2 ranks): biases on q/k/v/o and on the
MLP (the row-parallel layers' biases are replicated and added once), llama3 RoPE, MQA (one KV head
replicated on both ranks). The one-process engine is the reference: same logits within 1e-5 and the
same greedy tokens."""

from __future__ import annotations

import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.parallel import shard_slice
from wedlm.engine.parallel.sharding import ShardSlice
from wedlm.engine.runner import ForwardItem
from wedlm.model import ModelConfig

BIASED = dict(attention_bias=True, mlp_bias=True, num_key_value_heads=1, tie_word_embeddings=True,
              rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
ENGINE = dict(kv_block_size=4, num_kv_blocks=24, device="cpu", dtype="float32")
PROMPTS = [[(13 * i + 5 * j) % 250 for j in range(n)] for i, n in enumerate([3, 17, 1, 9])]


def test_row_parallel_biases_are_replicated():
    cfg = ModelConfig(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
                      o_proj_bias=True, mlp_bias=True, qk_norm=False)
    assert shard_slice("model.layers.0.self_attn.o_proj.bias", cfg, 1, 2) is None
    assert shard_slice("model.layers.0.mlp.down_proj.bias", cfg, 1, 2) is None
    assert shard_slice("model.layers.0.mlp.up_proj.bias", cfg, 1, 2) == ShardSlice(0, 64, 128)
    assert shard_slice("model.layers.0.self_attn.q_proj.bias", cfg, 1, 2) == ShardSlice(0, 32, 64)


def test_biased_llama3_model_matches_one_process(llama_factory):
    path = str(llama_factory("tp_llama_biased", seed=4, **BIASED))
    ref = LLM(path, **ENGINE)
    with LLM(path, tensor_parallel_size=2, **ENGINE) as tp:
        item = ForwardItem(list(PROMPTS[1]), list(range(17)), list(range(5)), 0, list(range(17)))
        for a, b in zip(ref.engine.runner.run([item]), tp.engine.runner.run([item])):
            torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, decoding="ar")
        assert [o["token_ids"] for o in tp.generate(PROMPTS, params)] == \
            [o["token_ids"] for o in ref.generate(PROMPTS, params)]
