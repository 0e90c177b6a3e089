"""The fused inference fast path gives the reference model's logits
(docs/invariants.md, "Fast paths agree with their reference")."""

import pytest
import torch

from wedlm.engine.fast_model import (
    FusedQKVAttention,
    FusedRMSNorm,
    FusedSwiGLU,
    TransposedGemvLinear,
    optimize_for_inference,
    plain_weights,
    use_transposed_gemv,
)
from wedlm.model import DenseAttention, KVCache, PagedAttention, SequenceSlice, load_model


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_fused_modules_match_reference(ckpt_factory, family):
    path = ckpt_factory(f"fast_{family}", family=family, seed=5)
    ref, fast = load_model(path), optimize_for_inference(load_model(path))
    assert isinstance(fast.model.layers[0].self_attn, FusedQKVAttention)
    assert isinstance(fast.model.layers[0].mlp, FusedSwiGLU)
    assert isinstance(fast.model.norm, FusedRMSNorm)
    assert fast.state_dict().keys() == ref.state_dict().keys()
    assert sum(p.numel() for p in fast.parameters()) == sum(p.numel() for p in ref.parameters())
    ids = torch.randint(0, 250, (2, 19), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(19).expand(2, 19)
    with torch.no_grad():
        dense = (ref(ids, pos, DenseAttention()) - fast(ids, pos, DenseAttention())).abs().max()
        cache = KVCache(2, 8, 4, ref.config.num_key_value_heads, 16, torch.float32, "cpu")
        meta = PagedAttention.build(cache, [SequenceSlice([3, 1, 6, 0, 2], 0, 19)])
        paged = fast(ids[0], pos[0], meta)
    assert dense.item() < 1e-5
    assert (paged - ref(ids[:1], pos[:1], DenseAttention())[0]).abs().max().item() < 1e-4


def test_low_precision_keeps_reference_norm(ckpt_factory):
    path = ckpt_factory("fast_qwen3", family="qwen3", seed=5)
    fast = optimize_for_inference(load_model(path, dtype="bfloat16"))
    assert type(fast.model.norm).__name__ == "RMSNorm"
    assert isinstance(fast.model.layers[0].mlp, FusedSwiGLU)


def test_fused_norm_under_bf16_autocast_matches_reference_without_warning(ckpt_factory):
    import warnings

    path = ckpt_factory("fast_qwen3", family="qwen3", seed=5)
    ref, fast = load_model(path), optimize_for_inference(load_model(path))
    ids = torch.randint(0, 250, (1, 11), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(11).expand(1, 11)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("error")  # the mixed-dtype F.rms_norm fallback warned here
        a, b = ref(ids, pos, DenseAttention()), fast(ids, pos, DenseAttention())
    # the same arithmetic up to bf16 rounding of fused vs separate q/k/v and gate/up matmuls
    assert a.dtype == b.dtype
    assert (a.float() - b.float()).abs().max().item() < 0.05 * a.float().abs().max().item()
    assert torch.equal(a.float().argmax(-1), b.float().argmax(-1))


def _mm_weight_shapes(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return sorted({tuple(e.input_shapes[1]) for e in prof.events() if e.name == "aten::mm" and e.input_shapes})


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_one_row_matmuls_on_transposed_weights(ckpt_factory, family):
    """`use_transposed_gemv`: one-row inputs run x @ W^T on a [in, out] copy (bias too, qwen2),
    with the reference's logits within float32 summation order; more rows keep F.linear exactly."""
    path = ckpt_factory(f"fast_{family}", family=family, seed=5)
    plain, fast = optimize_for_inference(load_model(path)), optimize_for_inference(load_model(path))
    assert use_transposed_gemv(fast)
    attn, mlp = fast.model.layers[0].self_attn, fast.model.layers[0].mlp
    assert attn.weight_t.shape == attn.qkv_weight.shape[::-1] and attn.weight_t.is_contiguous()
    assert torch.equal(mlp.weight_t, mlp.gate_up_weight.t())
    assert isinstance(fast.lm_head, TransposedGemvLinear) and isinstance(attn.o_proj, TransposedGemvLinear)
    assert fast.lm_head.weight_t.data_ptr() != fast.model.embed_tokens.weight.data_ptr()
    assert fast.state_dict().keys() == plain.state_dict().keys()
    assert any(t is attn.weight_t for t in plain_weights(fast))
    hidden, vocab = fast.config.hidden_size, fast.config.vocab_size
    one, many = torch.tensor([[7]]), torch.randint(0, 250, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = plain(one, torch.tensor([[0]]), DenseAttention()), fast(one, torch.tensor([[0]]), DenseAttention())
        shapes = _mm_weight_shapes(lambda: fast(one, torch.tensor([[0]]), DenseAttention()))
        pos = torch.arange(5)[None]
        c, d = plain(many, pos, DenseAttention()), fast(many, pos, DenseAttention())
    assert (a - b).abs().max().item() < 1e-5
    assert (hidden, vocab) in shapes  # lm_head read as [in, out]
    assert torch.equal(c, d)  # 5 rows: F.linear on the original weights, bit for bit
    assert not use_transposed_gemv(optimize_for_inference(load_model(path, dtype="bfloat16")))
    assert not use_transposed_gemv(optimize_for_inference(load_model(path)), max_bytes=1024)


def test_engine_uses_transposed_gemv_on_cpu(tiny_path):
    from wedlm import LLM

    llm = LLM(str(tiny_path), kv_block_size=4, device="cpu")
    assert llm.engine.runner.transposed_gemv
    assert llm.engine.matmuls.endswith("; one-row matmuls on transposed weight copies")
