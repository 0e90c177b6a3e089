"""Invariant 1 (docs/invariants.md): our logits equal transformers' on the same random checkpoint
(fp32, < 1e-4)."""

import pytest
import torch

from wedlm.model import DenseAttention, KVCache, PagedAttention, SequenceSlice, load_model

CASES = {
    "qwen3_gqa_untied": dict(family="qwen3", num_key_value_heads=2, tie_word_embeddings=False),
    "qwen3_tied_theta1e6": dict(family="qwen3", tie_word_embeddings=True, rope_theta=1e6),
    "qwen3_headdim_ne_hidden": dict(family="qwen3", head_dim=24, num_attention_heads=4,
                                    num_key_value_heads=1),
    "qwen3_sharded": dict(family="qwen3", max_shard_size="60KB"),
    "qwen2_bias_gqa": dict(family="qwen2", num_key_value_heads=2, rope_theta=1e6),
    "qwen2_tied_sharded": dict(family="qwen2", tie_word_embeddings=True, max_shard_size="60KB"),
    "qwen2_mha": dict(family="qwen2", num_key_value_heads=4),
    "qwen2_yarn": dict(family="qwen2", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 64}),
    "qwen3_linear": dict(family="qwen3", rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def hf_logits(path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_equal_transformers(ckpt_factory, name):
    path = ckpt_factory(name, **CASES[name])
    if "sharded" in name:
        assert (path / "model.safetensors.index.json").is_file()
    ids = torch.randint(0, 250, (2, 37), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(path, ids)
    model = load_model(path)
    positions = torch.arange(37).expand(2, 37)
    with torch.no_grad():
        ours = model(ids, positions, DenseAttention())
    assert ours.shape == expected.shape == (2, 37, 256)
    assert (ours - expected).abs().max().item() < 1e-4
    assert expected.std() > 0.1  # the random weights give non-trivial logits


def test_paged_prefill_and_decode_equal_dense(ckpt_factory):
    """The paged path (prefill in two chunks, then one token) matches a dense causal forward."""
    path = ckpt_factory("qwen3_gqa_untied", **CASES["qwen3_gqa_untied"])
    model = load_model(path)
    ids = torch.randint(0, 250, (23,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        dense = model(ids[None], torch.arange(23)[None], DenseAttention())[0]
        cache = KVCache(2, num_blocks=8, block_size=4, kv_heads=2, head_dim=16,
                        dtype=torch.float32, device="cpu")
        table = [5, 2, 7, 0, 3, 1]  # scattered physical blocks
        chunks = [(0, 10), (10, 22), (22, 23)]
        got = []
        for start, end in chunks:
            meta = PagedAttention.build(cache, [SequenceSlice(table, start, end - start)])
            got.append(model(ids[start:end], torch.arange(start, end), meta))
    assert (torch.cat(got) - dense).abs().max().item() < 1e-4


def test_paged_batch_of_mixed_lengths_equals_single(ckpt_factory):
    path = ckpt_factory("qwen2_bias_gqa", **CASES["qwen2_bias_gqa"])
    model = load_model(path)
    gen = torch.Generator().manual_seed(3)
    lengths = [5, 12, 1, 8]
    prompts = [torch.randint(0, 250, (n,), generator=gen) for n in lengths]
    cache = KVCache(2, num_blocks=32, block_size=4, kv_heads=2, head_dim=16,
                    dtype=torch.float32, device="cpu")
    tables = [[0, 1, 2], [3, 4, 5, 6], [7], [8, 9]]
    with torch.no_grad():
        meta = PagedAttention.build(cache, [SequenceSlice(t, 0, n) for t, n in zip(tables, lengths)])
        batched = model(torch.cat(prompts), torch.cat([torch.arange(n) for n in lengths]), meta)
        singles = [model(p[None], torch.arange(len(p))[None], DenseAttention())[0] for p in prompts]
    assert (batched - torch.cat(singles)).abs().max().item() < 1e-4


def test_logits_indices_selects_rows(ckpt_factory):
    path = ckpt_factory("qwen3_gqa_untied", **CASES["qwen3_gqa_untied"])
    model = load_model(path)
    ids = torch.randint(0, 250, (1, 9), generator=torch.Generator().manual_seed(4))
    pos = torch.arange(9)[None]
    with torch.no_grad():
        full = model(ids, pos, DenseAttention())[0]
        some = model(ids, pos, DenseAttention(), logits_indices=torch.tensor([8, 2]))
    assert some.shape == (2, 256)
    assert torch.allclose(some, full[[8, 2]], atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_close_to_fp32(ckpt_factory, dtype):
    path = ckpt_factory("qwen3_gqa_untied", **CASES["qwen3_gqa_untied"])
    ref, low = load_model(path), load_model(path, dtype=dtype)
    assert low.dtype == getattr(torch, dtype)
    ids = torch.randint(0, 250, (1, 16), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(16)[None]
    with torch.no_grad():
        a = ref(ids, pos, DenseAttention())
        b = low(ids, pos, DenseAttention()).float()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9
    assert (a - b).abs().max().item() < 0.25 * a.abs().max().item()
