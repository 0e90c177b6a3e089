"""The fused inference fast path gives the reference model's logits
(docs/invariants.md, "Fast paths agree with their reference")."""

import pytest
import torch

from wedlm.engine.fast_model import FusedQKVAttention, FusedRMSNorm, FusedSwiGLU, optimize_for_inference
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
