"""Llama-family checkpoints (Llama, Mistral): our logits equal transformers' on the same random
checkpoint (float32, max abs difference < 1e-4) and engine `ar` greedy tokens equal
transformers' `generate`, for each attention / RoPE variant."""

import json

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.model import ConfigError, DenseAttention, load_model
from wedlm.model.config import ModelConfig

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
CASES = {
    "llama_gqa_untied": dict(num_key_value_heads=2),
    "llama_mqa_tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "llama_head_dim_override": dict(head_dim=24, num_attention_heads=4, num_key_value_heads=2),
    "llama_attention_bias": dict(attention_bias=True),
    "llama_mlp_bias": dict(mlp_bias=True, tie_word_embeddings=True),
    "llama_llama3_rope": dict(rope_parameters=LLAMA3),
    "llama_llama3_rope_v4_layout": dict(rope_parameters=dict(LLAMA3, rope_theta=5e5), v4_rope_layout=True),
    "llama_yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 16}),
    "llama_linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "llama_dynamic": dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    "llama_sharded": dict(max_shard_size="60KB"),
    "mistral_gqa": dict(family="mistral", num_key_value_heads=2, sliding_window=None),
}
PROMPTS = [[5, 17, 99, 3], [200, 1, 1, 1, 42, 42, 7, 8, 9, 10, 11], [77]]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, llama_factory):
    # no tokenizer: the byte tokenizer's <|mask|> would be banned from the engine's outputs
    return request.param, llama_factory(request.param, **CASES[request.param])


def test_logits_equal_transformers(case):
    from transformers import AutoModelForCausalLM

    name, path = case
    ids = torch.randint(0, 250, (2, 37), generator=torch.Generator().manual_seed(1))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(ids).logits
        ours = load_model(path)(ids, torch.arange(37).expand(2, 37), DenseAttention())
    assert ours.shape == expected.shape == (2, 37, 256)
    assert (ours - expected).abs().max().item() < 1e-4
    assert expected.std() > 0.1


def test_engine_greedy_equals_transformers(case):
    from transformers import AutoModelForCausalLM

    name, path = case
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), kv_block_size=4, device="cpu")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20, decoding="ar", ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out["token_ids"] == ref
        assert out["stats"]["decode_forwards"] == 20


def test_variant_flags_are_read(llama_factory):
    """The config fields each case sets reach the model (so the cases test what they name)."""
    cfg = {n: ModelConfig.from_file(llama_factory(n, **CASES[n])) for n in CASES}
    assert cfg["llama_attention_bias"].attention_bias and cfg["llama_attention_bias"].o_proj_bias
    assert cfg["llama_mlp_bias"].mlp_bias and not cfg["llama_mlp_bias"].attention_bias
    assert cfg["llama_mqa_tied"].num_key_value_heads == 1 and cfg["llama_mqa_tied"].tie_word_embeddings
    assert cfg["llama_head_dim_override"].head_dim == 24
    assert (cfg["llama_llama3_rope"].rope.rope_type, cfg["llama_llama3_rope"].rope.low_freq_factor) == ("llama3", 1.0)
    assert cfg["llama_llama3_rope_v4_layout"].rope.theta == 5e5
    assert cfg["llama_yarn"].rope.rope_type == "yarn" and cfg["llama_dynamic"].rope.rope_type == "dynamic"
    assert not any(c.qk_norm for c in cfg.values())


BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)


def test_mistral_sliding_window_refused_inside_the_context():
    with pytest.raises(ConfigError, match="sliding_window=1024 is not supported"):
        ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 1024})
    assert ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": None}).model_type == "mistral"
    assert ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 4096}).model_type == "mistral"


@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])
def test_unsupported_rope_type_names_the_field(field):
    raw = {**BASE, "model_type": "llama", field: {"rope_type": "longrope", "factor": 2.0}}
    with pytest.raises(ConfigError, match=f"{field}.rope_type='longrope' is not supported"):
        ModelConfig.from_dict(raw)


def test_other_unsupported_options():
    with pytest.raises(ConfigError, match="hidden_act='gelu' is not supported"):
        ModelConfig.from_dict({**BASE, "model_type": "llama", "hidden_act": "gelu"})
    with pytest.raises(ConfigError, match="partial_rotary_factor=0.5"):
        ModelConfig.from_dict({**BASE, "model_type": "llama",
                               "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})


def test_config_round_trip_keeps_llama_style():
    raw = {**BASE, "model_type": "llama", "attention_bias": True, "mlp_bias": True,
           "rope_scaling": dict(LLAMA3)}
    cfg = ModelConfig.from_dict(raw)
    again = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
