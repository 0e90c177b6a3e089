"""RoPE tables (`RotaryEmbedding.tabulate`, made by the engine's `optimize_for_inference`) hold
cos and sin exactly as a forward computes them."""

import torch

from wedlm.engine import fast_model
from wedlm.engine.fast_model import optimize_for_inference
from wedlm.model import load_model

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def test_tables_give_the_computed_cos_and_sin(ckpt_factory, llama_factory):
    """Tables of max_position_embeddings rows, bit for bit the per-forward values (llama3 scaling
    too), for positions of any shape and in the forward's dtype."""
    for path in (ckpt_factory("rope_qwen3", family="qwen3", seed=5), llama_factory("rope_llama3", rope_parameters=LLAMA3)):
        model = load_model(path)
        cfg, rotary = model.config, model.model.rotary
        pos = torch.randint(0, cfg.max_position_embeddings, (3, 17), generator=torch.Generator().manual_seed(1))
        cos, sin = rotary(pos, torch.float32)
        optimize_for_inference(model)
        assert rotary.cos_table.shape == rotary.sin_table.shape == (cfg.max_position_embeddings, cfg.head_dim)
        got_cos, got_sin = rotary(pos, torch.float32)
        assert got_cos.shape == (3, 17, cfg.head_dim)
        assert torch.equal(got_cos, cos) and torch.equal(got_sin, sin)
        assert torch.equal(rotary(pos[0], torch.bfloat16)[1], sin[0].bfloat16())


def test_no_table_past_the_size_limit(ckpt_factory, monkeypatch):
    model = load_model(ckpt_factory("rope_qwen3", family="qwen3", seed=5))
    needed = 8 * model.config.max_position_embeddings * model.config.head_dim
    monkeypatch.setattr(fast_model, "ROPE_TABLE_MAX_BYTES", needed - 1)
    optimize_for_inference(model)
    assert model.model.rotary.cos_table is None
    monkeypatch.setattr(fast_model, "ROPE_TABLE_MAX_BYTES", needed)
    optimize_for_inference(model)
    assert model.model.rotary.cos_table.numel() * 8 == needed
