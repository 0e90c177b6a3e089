"""Tensor parallelism (wedlm.engine.parallel) on CPU with gloo, 2 ranks, tiny random checkpoints.

The one-process engine is the reference: N=2 must give the same logits (within
1e-5, fp32) and the same greedy tokens for every decoder, on a Qwen3-style
checkpoint (q/k norm, GQA, untied), a Qwen2-style one (bias, tied), one with
fewer KV heads than ranks and one sharded over several files; each rank holds
its half of the weights; a bad size is a ValueError before any process starts.
Process lifetimes are in test_tensor_parallel_lifecycle.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.parallel import check_tensor_parallel_size, shard_slice
from wedlm.engine.parallel.sharding import ShardSlice
from wedlm.engine.runner import ForwardItem
from wedlm.model import ModelConfig

DECODERS = ["ar", "wedlm", "blockwise", "verified"]
BATCH = [[(13 * i + 5 * j) % 250 for j in range(n)] for i, n in enumerate([3, 17, 1, 9, 30, 5, 12, 2])]
QWEN3 = dict(family="qwen3", wedlm=True, tokenizer=True, seed=0)
VARIANTS = {
    "qwen3": QWEN3,  # q/k norm, GQA 4:2, untied
    "qwen2": dict(family="qwen2", wedlm=True, tokenizer=True, seed=1, tie_word_embeddings=True),  # bias, tied
    "qwen3-kv-replicated": dict(QWEN3, seed=2, num_key_value_heads=1),  # 1 KV head on 2 ranks
    "qwen3-sharded-files": dict(QWEN3, seed=3, max_shard_size="20KB"),  # an index and several files
}
ENGINE = dict(kv_block_size=4, wedlm_window_size=4, num_kv_blocks=24, device="cpu", dtype="float32")


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, ckpt_factory):
    """(one-process LLM, 2-rank LLM) over one checkpoint and a 24-block cache.

    One tensor-parallel engine per process at a time: pytest runs every test of one
    variant, then tears the pair down before it builds the next.
    """
    path = str(ckpt_factory(f"tp_{request.param}", **VARIANTS[request.param]))
    if "max_shard_size" in VARIANTS[request.param]:
        assert len(set(json.loads(Path(path, "model.safetensors.index.json").read_text())["weight_map"].values())) > 2
    ref, tp = LLM(path, **ENGINE), LLM(path, tensor_parallel_size=2, **ENGINE)
    yield ref, tp
    tp.close()


def items_for(prompts: list[list[int]], first_block: int, block_size: int = 4) -> list[ForwardItem]:
    """Prefill items on fresh blocks, logits at every row."""
    out, block = [], first_block
    for ids in prompts:
        n = -(-len(ids) // block_size)
        out.append(ForwardItem(list(ids), list(range(len(ids))), list(range(block, block + n)), 0,
                               list(range(len(ids)))))
        block += n
    return out


# ---- sizes and the sharding table (no process) -------------------------------------------


def tiny_config(**kw) -> ModelConfig:
    fields = dict(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    fields.update(kw)
    return ModelConfig(**fields)


@pytest.mark.parametrize("size, kw, message", [
    (3, {}, "num_attention_heads=4 is not divisible by tensor_parallel_size=3"),
    (2, dict(intermediate_size=129), "intermediate_size=129 is not divisible by tensor_parallel_size=2"),
    (2, dict(vocab_size=255), "vocab_size=255 is not divisible by tensor_parallel_size=2"),
    (4, dict(num_attention_heads=12, num_key_value_heads=3, intermediate_size=128),
     "num_key_value_heads=3 neither divides nor is divisible by tensor_parallel_size=4"),
    (0, {}, "tensor_parallel_size must be an integer >= 1, got 0"),
])
def test_sizes_that_do_not_split_the_model_are_value_errors(size, kw, message):
    with pytest.raises(ValueError, match=message):
        check_tensor_parallel_size(tiny_config(**kw), size)


def test_shard_table_splits_heads_and_replicates_kv_heads_when_fewer_than_ranks():
    cfg = tiny_config()  # 4 heads, 2 KV heads, head_dim 16
    assert shard_slice("model.layers.0.self_attn.q_proj.weight", cfg, 1, 2) == ShardSlice(0, 32, 64)
    assert shard_slice("model.layers.0.self_attn.o_proj.weight", cfg, 1, 2) == ShardSlice(1, 32, 64)
    assert shard_slice("model.layers.1.self_attn.k_proj.bias", cfg, 1, 2) == ShardSlice(0, 16, 32)
    assert shard_slice("model.layers.0.mlp.gate_proj.weight", cfg, 1, 2) == ShardSlice(0, 64, 128)
    assert shard_slice("model.layers.0.mlp.down_proj.weight", cfg, 0, 2) == ShardSlice(1, 0, 64)
    assert shard_slice("model.embed_tokens.weight", cfg, 1, 2) == ShardSlice(0, 128, 256)
    assert shard_slice("lm_head.weight", cfg, 1, 2) == ShardSlice(0, 128, 256)
    assert shard_slice("model.layers.0.self_attn.q_norm.weight", cfg, 1, 2) is None
    assert shard_slice("model.norm.weight", cfg, 1, 2) is None
    # 2 KV heads on 4 ranks: ranks 0, 1 hold KV head 0 (their query heads are 0 and 1), ranks 2, 3 KV head 1
    assert [shard_slice("model.layers.0.self_attn.v_proj.weight", cfg, r, 4) for r in range(4)] == \
        [ShardSlice(0, 0, 16), ShardSlice(0, 0, 16), ShardSlice(0, 16, 32), ShardSlice(0, 16, 32)]


def test_bad_size_fails_before_any_process_starts(ckpt_factory):
    path = ckpt_factory("tp_qwen3", **QWEN3)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tensor_parallel_size=3"):
        LLM(str(path), tensor_parallel_size=3, device="cpu")
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1, got True"):
        LLM(str(path), tensor_parallel_size=True, device="cpu")
    assert {c.pid for c in psutil.Process().children(recursive=True)} == before


# ---- equality with one process ------------------------------------------------------------


def test_logits_of_one_forward_match_one_process(pair):
    """Prefill of a mixed batch, then a forward on top of the cache: every row within 1e-5."""
    ref, tp = pair
    decode = ForwardItem([7, 8, 9], [17, 18, 19], [0, 1, 2, 3, 4], 17, [0, 1, 2])  # after BATCH[1]'s 17 rows
    for items in (items_for([BATCH[1], BATCH[3], BATCH[2]], 0), [decode]):
        want = ref.engine.runner.run(items)
        got = tp.engine.runner.run(items)
        for a, b in zip(want, got):
            assert b.logits.shape == a.logits.shape == (len(a.argmax), 256)
            torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
            assert b.argmax == a.argmax


def test_each_rank_holds_about_half_the_parameters(pair):
    """Exactly its slices per the sharding table: half of every split weight, all of the norms."""
    ref, tp = pair
    model = ref.engine.model
    full = sum(p.numel() * p.element_size() for p in model.parameters())

    def rank_bytes(rank: int) -> int:
        total = 0
        for name, p in model.named_parameters():
            piece = shard_slice(name, model.config, rank, 2)
            n = p.numel() if piece is None else p.numel() // p.shape[piece.dim] * (piece.stop - piece.start)
            total += n * p.element_size()
        return total

    per_rank = tp.engine.runner.rank_param_bytes()
    assert per_rank == [rank_bytes(0), rank_bytes(1)]
    assert all(0.5 * full < b < 0.55 * full for b in per_rank)
    kv_split = 2 if model.config.num_key_value_heads >= 2 else 1
    assert tp.engine.runner.kv_cache.nbytes() * kv_split == ref.engine.runner.kv_cache.nbytes()


def test_greedy_tokens_match_one_process_for_every_decoder(pair):
    """8 mixed-length prompts, two per decoder, on a 24-block cache (preemptions), then
    half of them again (prefix-cache hits)."""
    ref, tp = pair
    mixed = [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, decoding=d,
                            wedlm_entropy_threshold=None if d == "ar" else 5.0) for d in DECODERS] * 2
    want = ref.generate(BATCH, mixed)
    got = tp.generate(BATCH, mixed)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]
    assert sum(o["stats"]["preemptions"] for o in got) > 0
    hits_before = tp.metrics()["prefix_cache_hit_tokens"]
    again = tp.generate(BATCH[4:], mixed[4:])
    assert [o["token_ids"] for o in again] == [o["token_ids"] for o in want[4:]]
    assert tp.metrics()["prefix_cache_hit_tokens"] > hits_before
    assert tp.metrics()["kv_blocks_free"] == 24


def test_a_direct_forward_of_rank_0s_shard_is_refused_and_the_engine_still_works(pair):
    """Forwards outside the runner would wait forever in an all-reduce: refused at once."""
    from wedlm.model import DenseAttention

    ref, tp = pair
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(RuntimeError, match="only in lockstep with the other ranks"):
        tp.engine.model(ids, torch.arange(3)[None], DenseAttention())
    p = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, decoding="ar")
    assert tp.generate([BATCH[3]], p)[0]["token_ids"] == ref.generate([BATCH[3]], p)[0]["token_ids"]
