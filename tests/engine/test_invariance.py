"""Invariants 6 and 8 (docs/invariants.md): batch invariance (alone / batch of 8 / prefix hit /
preempted) and no lost blocks."""

import pytest

from wedlm import LLM, SamplingParams

BATCH = [[(13 * i + 5 * j) % 250 for j in range(n)] for i, n in enumerate([3, 17, 1, 9, 30, 5, 12, 2])]
DECODERS = ["ar", "wedlm", "verified", "blockwise"]


def params(decoding, **kw):
    return SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, decoding=decoding, **kw)


@pytest.mark.parametrize("decoding", DECODERS)
def test_greedy_tokens_do_not_depend_on_the_batch(make_llm, decoding):
    llm = make_llm()
    p = params(decoding, wedlm_entropy_threshold=5.0) if decoding != "ar" else params("ar")
    alone = [llm.generate([q], p)[0]["token_ids"] for q in BATCH]
    batched = llm.generate(BATCH, p)
    assert [o["token_ids"] for o in batched] == alone
    # a second request sharing a long prefix hits the prefix cache and still matches
    before = llm.metrics()["prefix_cache_hit_tokens"]
    hit = llm.generate([BATCH[4]], p)[0]
    assert hit["token_ids"] == alone[4]
    assert hit["stats"]["prefix_cache_hit_tokens"] == 28  # 7 full blocks of 4; the last token is fed
    assert llm.metrics()["prefix_cache_hit_tokens"] - before == 28


def test_preemption_resumes_with_identical_tokens_and_frees_everything(tiny_path):
    llm = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, num_kv_blocks=24, device="cpu")
    ref = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu")
    mixed = [params(d, wedlm_entropy_threshold=5.0) for d in DECODERS] * 2
    expected = [ref.generate([q], p)[0]["token_ids"] for q, p in zip(BATCH, mixed)]
    outs = llm.generate(BATCH, mixed)
    assert [o["token_ids"] for o in outs] == expected
    assert sum(o["stats"]["preemptions"] for o in outs) > 0
    m = llm.metrics()
    assert m["kv_blocks_free"] == m["kv_blocks_total"] == 24 and m["num_running"] == m["num_waiting"] == 0


def test_contention_never_refuses_a_request_that_fits_alone(tiny_path):
    """20 mixed requests sharing prefixes on an 8-block cache: all finish, none refused."""
    import random

    llm = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, num_kv_blocks=8, max_model_len=32,
              max_num_seqs=16, device="cpu")
    rnd = random.Random(8)
    common = [rnd.randrange(250) for _ in range(6)]
    prompts = [common[:rnd.randrange(7)] + [rnd.randrange(250) for _ in range(rnd.randrange(1, 10))]
               for _ in range(20)]
    mixed = [SamplingParams(temperature=0, ignore_eos=True, decoding=DECODERS[i % 4], max_tokens=rnd.randrange(1, 20))
             for i in range(20)]
    outs = llm.generate(prompts, mixed)
    assert [o.get("error") for o in outs] == [None] * 20
    assert all(o["finish_reason"] == "length" for o in outs)
    assert sum(o["stats"]["preemptions"] for o in outs) > 0
    for q, p, o in zip(prompts, mixed, outs):
        assert llm.generate([q], p)[0]["token_ids"] == o["token_ids"]
    assert llm.metrics()["kv_blocks_free"] == 8


def test_blocks_return_after_aborts_and_rejections(make_llm):
    llm = make_llm(max_model_len=64)
    total = llm.metrics()["kv_blocks_total"]
    ids = [llm.add_request(q, params(d)) for q, d in zip(BATCH, DECODERS * 2)]
    llm.step()
    llm.step()
    assert llm.metrics()["kv_blocks_free"] < total
    for rid in ids[::2]:
        assert llm.abort(rid)
    with pytest.raises(ValueError):
        llm.add_request(list(range(64)), params("ar"))
    while llm.has_unfinished():
        llm.step()
    assert llm.metrics()["kv_blocks_free"] == total


def test_request_larger_than_the_cache_is_refused(tiny_path):
    llm = LLM(str(tiny_path), kv_block_size=4, num_kv_blocks=5, device="cpu")
    with pytest.raises(ValueError, match="needs up to 6 KV blocks .* num_kv_blocks=5"):
        llm.add_request([1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=20, decoding="ar"))
    out = llm.generate([[1, 2, 3, 4]], params("ar"))[0]  # 4 + 14 rows = 5 blocks: fits
    assert len(out["token_ids"]) == 14
    assert llm.metrics()["kv_blocks_free"] == 5


@pytest.mark.parametrize("decoding", ["wedlm", "blockwise", "verified", "ar"])
def test_a_request_that_ends_in_its_first_forward_leaves_its_prompt_cached(decoding):
    from pathlib import Path

    from wedlm.engine.chat import encode_chat

    shipped = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
    llm = LLM(str(shipped), enforce_eager=True, max_num_seqs=2, max_model_len=256)
    ids = encode_chat(llm.tokenizer, [{"role": "user", "content": "Sort the list: Tom, Anna, Ben, Mia, Leo, Zoe."}])
    assert len(ids) == 27  # one full block of 16 rows, 11 rows in the second
    params = SamplingParams(temperature=0, max_tokens=4, decoding=decoding)
    first = llm.generate([ids], params)[0]
    if decoding in ("wedlm", "blockwise"):
        assert first["stats"]["decode_forwards"] == 1  # the answer's 4 tokens came from one forward
    again = llm.generate([ids], params)[0]
    assert (first["stats"]["prefix_cache_hit_tokens"], again["stats"]["prefix_cache_hit_tokens"]) == (0, 16)
    assert again["token_ids"] == first["token_ids"]
