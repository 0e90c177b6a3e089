"""Invariant 3 (docs/invariants.md): after every step of every decoder, cached rows equal a
fresh prefill's K/V.

All four decoders run in one batch (plus an aggressive-tau WeDLM request that
fills several masks per step and the official argmin fallback), and after each
step every running sequence's rows 0..num_cached-1 are compared with the K/V
of a fresh causal prefill of its committed tokens.
"""

import torch

from wedlm import SamplingParams
from wedlm.model import KVCache, PagedAttention, SequenceSlice


def fresh_kv(model, tokens, block_size):
    cfg = model.config
    n = len(tokens)
    blocks = -(-n // block_size)
    cache = KVCache(cfg.num_hidden_layers, blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                    torch.float32, "cpu")
    with torch.inference_mode():
        meta = PagedAttention.build(cache, [SequenceSlice(list(range(blocks)), 0, n)])
        model.hidden_states(torch.tensor(tokens), torch.arange(n), meta)
    return [(cache.flat(i)[0][:n], cache.flat(i)[1][:n]) for i in range(cfg.num_hidden_layers)]


def engine_kv(engine, seq):
    bs, n = engine.block_manager.block_size, seq.num_cached
    slots = torch.tensor([seq.block_table[p // bs] * bs + p % bs for p in range(n)], dtype=torch.int64)
    cache = engine.runner.kv_cache
    return [(cache.flat(i)[0][slots], cache.flat(i)[1][slots]) for i in range(len(cache.k))]


def expected_cached(seq):
    """How many committed rows each decoder keeps valid between steps."""
    n, d = len(seq.tokens), seq.params.decoding
    if d in ("ar", "verified"):
        return {n - 1}  # the last committed token is the next anchor
    if d == "blockwise":
        return {n, n - seq.window_size}  # a just-completed block is fed with the next one
    return {n}


def test_cache_rows_equal_fresh_prefill_for_every_decoder(make_llm):
    llm = make_llm(wedlm_window_size=5)
    engine = llm.engine
    requests = {
        "ar": SamplingParams(temperature=0, decoding="ar"),
        "wedlm": SamplingParams(temperature=0, decoding="wedlm"),
        "wedlm_tau5": SamplingParams(temperature=0, decoding="wedlm", wedlm_entropy_threshold=5.0),
        "wedlm_argmin": SamplingParams(temperature=0.8, decoding="wedlm", wedlm_fallback="argmin", seed=1),
        "blockwise": SamplingParams(temperature=0, decoding="blockwise", wedlm_entropy_threshold=5.0),
        "verified": SamplingParams(temperature=0, decoding="verified", wedlm_entropy_threshold=5.0),
        "verified_t": SamplingParams(temperature=1.0, decoding="verified", seed=3),
    }
    prompts = {name: [(7 * i + 3) % 250 for i in range(3 + k)] for k, name in enumerate(requests)}
    for name, p in requests.items():
        p.max_tokens, p.ignore_eos = 17, True
        llm.add_request(prompts[name], p, request_id=name)
    checked = multi = 0
    while llm.has_unfinished():
        for d in llm.step():
            multi += len(d.new_token_ids) > 1
        for seq in engine.scheduler.running:
            assert seq.num_cached in expected_cached(seq), seq.request_id
            ours = engine_kv(engine, seq)
            ref = fresh_kv(engine.model, seq.tokens[:seq.num_cached], 4)
            for (k, v), (rk, rv) in zip(ours, ref):
                assert torch.allclose(k, rk, atol=1e-4) and torch.allclose(v, rv, atol=1e-4), seq.request_id
            checked += 1
    assert checked > 40 and multi > 0
    assert engine.block_manager.num_free == engine.block_manager.num_blocks
