"""The decoder a request gets when it names none: `wedlm` where the model has a [MASK] token,
`ar` for a plain AR checkpoint (which could not run `wedlm` at all)."""

from wedlm import LLM, SamplingParams

PROMPT = [5, 17, 42, 9, 101, 3]


def test_a_plain_ar_model_decodes_with_ar_by_default(ckpt_factory):
    path = ckpt_factory("default_decoding_ar", family="qwen3", seed=4)
    llm = LLM(str(path), kv_block_size=4, device="cpu")
    assert llm.engine.mask_token_id is None
    default = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    ar = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, decoding="ar"))[0]
    assert default["token_ids"] == ar["token_ids"] and len(ar["token_ids"]) == 12
    assert default["stats"]["decode_forwards"] == 12  # one token per forward: the AR decoder


def test_a_wedlm_model_decodes_with_wedlm_by_default(ckpt_factory):
    path = ckpt_factory("default_decoding_wedlm", family="qwen3", seed=4, wedlm=True)
    llm = LLM(str(path), kv_block_size=4, device="cpu")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert params.resolve(llm.engine.model_defaults).decoding == "wedlm"
    assert SamplingParams(decoding="verified").resolve(llm.engine.model_defaults).decoding == "verified"
