"""Bad checkpoints raise one clear error each, naming the file and tensor."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from wedlm.model import CheckpointError, ConfigError, load_model
from wedlm.model.config import ModelConfig


@pytest.fixture()
def ckpt(ckpt_factory, tmp_path):
    src = ckpt_factory("qwen3_plain", family="qwen3")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_missing_tensor(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing tensor.*layers\.1\.mlp\.up_proj"):
        load_model(ckpt)


def test_wrong_shape(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:8]
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"k_proj\.weight has shape \(8, 64\).*expects \(32, 64\)"):
        load_model(ckpt)


def test_unknown_model_type(ckpt):
    raw = json.loads((ckpt / "config.json").read_text())
    raw["model_type"] = "gpt2"
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"config\.json: model_type='gpt2' is not supported"):
        load_model(ckpt)


def test_unsupported_rope_scaling(ckpt):
    raw = json.loads((ckpt / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0}
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="rope_type='longrope' is not supported"):
        load_model(ckpt)


def test_truncated_safetensors(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_model(ckpt)


def test_truncated_header(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(CheckpointError, match="unreadable safetensors"):
        load_model(ckpt)


def test_missing_files(ckpt, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(ckpt)


def test_missing_shard(ckpt_factory, tmp_path):
    src = ckpt_factory("qwen3_sharded_err", family="qwen3", max_shard_size="60KB")
    dst = tmp_path / "sharded"
    shutil.copytree(src, dst)
    shard = sorted(dst.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard.name}: shard listed"):
        load_model(dst)


def test_bad_dtype(ckpt):
    with pytest.raises(ValueError, match="dtype='int8' is not supported"):
        load_model(ckpt, dtype="int8")


def test_wedlm_config_fields():
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg = ModelConfig.from_dict({**base, "model_type": "wedlm", "attention_bias": True,
                                 "qk_norm": False, "mask_token_id": 299})
    assert (cfg.attention_bias, cfg.qk_norm, cfg.mask_token_id) == (True, False, 299)
    with pytest.raises(ConfigError, match="mask_token_id=300 is outside vocab_size=300"):
        ModelConfig.from_dict({**base, "model_type": "wedlm", "mask_token_id": 300})
    with pytest.raises(ConfigError, match="not a multiple"):
        ModelConfig.from_dict({**base, "model_type": "qwen3", "num_key_value_heads": 3})
    assert ModelConfig.from_dict(ModelConfig.from_dict({**base, "model_type": "wedlm",
                                                        "mask_token_id": 5}).to_dict()).mask_token_id == 5
