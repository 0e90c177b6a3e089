"""The LLM facade: generate / generate_stream / step-level API / errors / metrics."""

import pytest

from wedlm import LLM, SamplingParams
from wedlm.engine.outputs import StreamDelta

GREEDY_AR = SamplingParams(temperature=0, max_tokens=12, decoding="ar", ignore_eos=True)


def test_generate_results_in_input_order_with_stats(llm):
    prompts = ["hello", [1, 2, 3, 4, 5, 6, 7], "a"]
    outs = llm.generate(prompts, GREEDY_AR)
    alone = [llm.generate([p], GREEDY_AR)[0] for p in prompts]
    assert [o["token_ids"] for o in outs] == [a["token_ids"] for a in alone]
    for o in outs:
        assert set(o) == {"text", "token_ids", "finish_reason", "stats"}
        assert len(o["token_ids"]) == 12 and o["finish_reason"] == "length"
        assert o["text"] == llm.tokenizer.decode(o["token_ids"])
        s = o["stats"]
        assert s["decode_tokens"] == 12 and s["decode_forwards"] == 12 and s["commits"] == [1] * 12
        assert s["tokens_per_forward"] == 1.0 and s["p_cache"] == 1.0 and s["ttft_s"] > 0
    assert outs[0]["stats"]["prompt_tokens"] == 5


def test_generate_stream_concatenates_to_generate(llm):
    prompts = ["hello", "xyz"]
    full = llm.generate(prompts, GREEDY_AR)
    got = {0: ([], ""), 1: ([], "")}
    finals = {}
    for item in llm.generate_stream(prompts, GREEDY_AR):
        ids, text = got[item["index"]]
        got[item["index"]] = (ids + item["new_token_ids"], text + item["new_text"])
        if item["finished"]:
            finals[item["index"]] = item
    for i in range(2):
        assert got[i] == (full[i]["token_ids"], full[i]["text"])
        assert finals[i]["finish_reason"] == "length" and finals[i]["stats"]["decode_tokens"] == 12


def test_step_level_api_and_abort(llm):
    before = llm.metrics()
    rid = llm.add_request([3, 4, 5], GREEDY_AR, request_id="x1")
    assert rid == "x1" and llm.has_unfinished()
    deltas = llm.step()
    assert len(deltas) == 1 and isinstance(deltas[0], StreamDelta)
    assert deltas[0].request_id == "x1" and deltas[0].step_index == 0 and len(deltas[0].new_token_ids) == 1
    assert llm.metrics()["num_running"] == 1 and llm.metrics()["kv_blocks_used"] > 0
    final = llm.abort("x1")
    assert (final.request_id, final.finished, final.finish_reason) == ("x1", True, "abort")
    assert (final.stats["prompt_tokens"], final.stats["decode_tokens"], final.stats["decode_forwards"]) == (3, 1, 1)
    assert llm.abort("x1") is None
    assert llm.step() == []  # the abort is reported once, by abort() itself
    assert not llm.has_unfinished()
    assert llm.metrics()["kv_blocks_free"] == before["kv_blocks_free"]


def test_add_request_errors_name_the_limit(make_llm):
    llm = make_llm(max_model_len=32)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.add_request([], GREEDY_AR)
    with pytest.raises(ValueError, match="prompt has 32 tokens; max_model_len is 32 and needs at least 1"):
        llm.add_request(list(range(32)), GREEDY_AR)
    with pytest.raises(ValueError, match=r"prompt token ids must be integers in \[0, 256\)"):
        llm.add_request([1, 999], GREEDY_AR)
    with pytest.raises(ValueError, match=r"prompt token ids must be integers in \[0, 256\)"):
        llm.add_request([True, 5], GREEDY_AR)  # a bool is not a token id
    with pytest.raises(ValueError, match="prompt must be a string or a list of token ids, got int"):
        llm.add_request(5, GREEDY_AR)
    with pytest.raises(ValueError, match="prompt must be a string or a list of token ids, got NoneType"):
        llm.add_request(None, GREEDY_AR)
    with pytest.raises(ValueError, match="prompt must be a string or a list of token ids, got bytes"):
        llm.add_request(b"hi", GREEDY_AR)  # bytes iterate as ints, which are not token ids
    llm.add_request([1], GREEDY_AR, request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        llm.add_request([1], GREEDY_AR, request_id="dup")
    assert llm.abort("dup").finish_reason == "abort"
    assert llm.metrics()["kv_blocks_free"] == llm.metrics()["kv_blocks_total"]


@pytest.mark.parametrize("bad, name", [({"temperature": 0, "max_tokens": 2}, "dict"), ("greedy", "str"), (5, "int")])
def test_sampling_params_of_the_wrong_type_is_named(make_llm, bad, name):
    """A dict is iterable (its keys): without the type check it was counted as two params for one prompt."""
    llm = make_llm(max_model_len=32)
    for call in (llm.generate, lambda *a: list(llm.generate_stream(*a))):
        with pytest.raises(ValueError, match=f"sampling_params must be a SamplingParams or a list of them, "
                                             f"got {name}$") as info:
            call([[1, 2]], bad)
        assert info.value.param == "sampling_params"
    assert not llm.has_unfinished()
    assert [len(o["token_ids"]) for o in llm.generate([[1, 2]], [GREEDY_AR])] == [GREEDY_AR.max_tokens]


def test_llm_properties(llm, tiny_path):
    assert llm.model_path == str(tiny_path)
    assert llm.max_model_len == 512
    assert llm.tokenizer.decode(llm.tokenizer.encode("héllo")) == "héllo"


def test_generation_config_supplies_model_defaults(tiny_path, tmp_path):
    import json
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_path, folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"wedlm_window_size": 6, "wedlm_entropy_threshold": 0.7, "wedlm_pos_penalty_factor": 0.1,
         "wedlm_stop_by_ar": True, "wedlm_stop_in_run": True}))
    llm = LLM(str(folder), kv_block_size=4, device="cpu")
    rid = llm.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=30))
    seq = llm.engine.seqs[rid]
    assert seq.window_size == 6 and len(seq.window) == 6
    assert (seq.params.wedlm_entropy_threshold, seq.params.wedlm_pos_penalty_factor) == (0.7, 0.1)
    assert seq.params.wedlm_stop_by_ar is True and llm.decoding_defaults["wedlm_stop_by_ar"] is True
    assert seq.params.wedlm_stop_in_run is True and llm.decoding_defaults["wedlm_stop_in_run"] is True
    explicit = llm.add_request([1, 2], SamplingParams(wedlm_entropy_threshold=0.2, wedlm_window_size=3))
    assert llm.engine.seqs[explicit].params.wedlm_entropy_threshold == 0.2
    assert llm.engine.seqs[explicit].window_size == 3
    while llm.has_unfinished():
        llm.step()
    assert llm.metrics()["kv_blocks_free"] == llm.metrics()["kv_blocks_total"]


def test_numpy_and_tuple_token_ids_are_prompts(llm):
    import numpy as np

    ref = llm.generate([[72, 101, 108]], GREEDY_AR)[0]["token_ids"]
    assert llm.generate(np.array([72, 101, 108]), GREEDY_AR)[0]["token_ids"] == ref
    assert llm.generate((72, 101, 108), GREEDY_AR)[0]["token_ids"] == ref
    assert llm.generate([np.array([72, 101, 108]), (72, 101, 108)], GREEDY_AR)[1]["token_ids"] == ref


@pytest.mark.parametrize("bad, message", [
    ({"wedlm_window_size": 0}, "wedlm_window_size must be an integer >= 1, got 0"),
    ({"wedlm_window_size": "8"}, "wedlm_window_size must be an integer >= 1"),
    ({"wedlm_entropy_threshold": -1}, "wedlm_entropy_threshold must be >= 0"),
    ({"wedlm_pos_penalty_factor": "x"}, "wedlm_pos_penalty_factor must be"),
    ({"wedlm_stop_by_ar": 1}, "wedlm_stop_by_ar must be true or false, got 1"),
    ({"wedlm_stop_in_run": "yes"}, "wedlm_stop_in_run must be true or false, got 'yes'"),
])
def test_bad_generation_config_is_refused_at_load_not_a_hang(tiny_path, tmp_path, bad, message):
    """A window of 0 in generation_config.json would stall every request forever: load refuses it."""
    import json
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_path, folder)
    (folder / "generation_config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=f"generation_config.json: {message}"):
        LLM(str(folder), kv_block_size=4, device="cpu")


@pytest.mark.parametrize("kwargs, field", [
    ({"max_num_seqs": "4"}, "max_num_seqs"), ({"kv_block_size": True}, "kv_block_size"),
    ({"max_model_len": 0}, "max_model_len"), ({"wedlm_window_size": 2.5}, "wedlm_window_size"),
    ({"num_kv_blocks": -1}, "num_kv_blocks"), ({"gpu_memory_utilization": "0.9"}, "gpu_memory_utilization"),
])
def test_bad_engine_arguments_raise_value_error_naming_them(tiny_path, kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        LLM(str(tiny_path), device="cpu", **kwargs)


def test_reset_prefix_cache(make_llm):
    """A repeated prompt hits the prefix cache; after `reset_prefix_cache` it is computed again
    (the same tokens either way); no reset while a request holds blocks."""
    llm = make_llm(kv_block_size=4)
    prompt = list(range(5, 30))  # 25 tokens: 6 full blocks of 4
    first = llm.generate([prompt], GREEDY_AR)[0]
    again = llm.generate([prompt], GREEDY_AR)[0]
    assert again["stats"]["prefix_cache_hit_tokens"] == 24 and again["token_ids"] == first["token_ids"]
    llm.add_request(prompt, GREEDY_AR, request_id="held")
    llm.step()
    assert llm.reset_prefix_cache() is False
    llm.abort("held")
    assert llm.reset_prefix_cache() is True
    cold = llm.generate([prompt], GREEDY_AR)[0]
    assert cold["stats"]["prefix_cache_hit_tokens"] == 0 and cold["token_ids"] == first["token_ids"]


def test_window_room_is_checked_only_for_decoders_with_a_window(make_llm):
    """A step budget too small for a window refuses `wedlm` (naming the knob and the limit) but
    still serves `ar`, which feeds no window."""
    llm = make_llm(max_num_batched_tokens=8)  # W = 4 needs 2 * 4 + 1 = 9
    with pytest.raises(ValueError, match=r"wedlm_window_size=4 is above this engine's limit of 3: .*"
                                         r"\(2 \* 4 \+ 1 > max_num_batched_tokens=8\)"):
        llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=4, decoding="wedlm"))
    out = llm.generate(["hello"], GREEDY_AR)[0]
    assert len(out["token_ids"]) == 12 and out["token_ids"] == make_llm().generate(["hello"], GREEDY_AR)[0]["token_ids"]
