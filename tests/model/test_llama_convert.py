"""`wedlm convert` on Llama-family checkpoints: the style flags carry over, and a vocabulary with no
spare row for `<|mask|>` grows (embedding and untied output layer) without changing any old logit."""

import json

import pytest
import torch
from safetensors.torch import load_file

from wedlm.cli.main import main
from wedlm.convert import convert
from wedlm.model import DenseAttention, load_model
from wedlm.testing import byte_tokenizer


def _drop_mask_token(folder):
    """Rewrite the byte tokenizer in `folder` without <|mask|> (255 tokens)."""
    data = json.loads((folder / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|mask|>"]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("mask_token", None)
    cfg.pop("added_tokens_decoder", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("tied", [False, True])
def test_full_vocabulary_grows_for_the_mask_token(llama_factory, tmp_path, tied):
    src = llama_factory(f"convert_llama_{tied}", vocab_size=255, tie_word_embeddings=tied, attention_bias=True)
    byte_tokenizer(256).save_pretrained(src)
    _drop_mask_token(src)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst)]) == 0
    raw = json.loads((dst / "config.json").read_text())
    assert (raw["model_type"], raw["vocab_size"], raw["mask_token_id"]) == ("wedlm", 256, 255)
    assert (raw["attention_bias"], raw["o_proj_bias"], raw["mlp_bias"], raw["qk_norm"]) == (True, True, False, False)
    old, new = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    emb = new["model.embed_tokens.weight"]
    assert emb.shape == (256, 64) and torch.equal(emb[:255], old["model.embed_tokens.weight"])
    assert torch.allclose(emb[255], old["model.embed_tokens.weight"].mean(0))
    assert ("lm_head.weight" in new) is (not tied)
    ids = torch.randint(0, 255, (1, 20), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(20)[None]
    with torch.no_grad():
        a = load_model(src)(ids, pos, DenseAttention())
        b = load_model(dst)(ids, pos, DenseAttention())
    assert b.shape[-1] == 256 and torch.equal(a, b[..., :255])


def test_spare_rows_keep_weights_byte_for_byte(llama_factory, tmp_path):
    src = llama_factory("convert_llama_spare", tokenizer=True, mlp_bias=True)
    dst = convert(src, tmp_path / "dst")
    raw = json.loads((dst / "config.json").read_text())
    assert (raw["vocab_size"], raw["mask_token_id"], raw["mlp_bias"], raw["o_proj_bias"]) == (256, 255, True, False)
    assert (dst / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_sliding_window_mistral_is_refused(llama_factory, tmp_path):
    from wedlm.model import ConfigError

    src = llama_factory("convert_mistral_window", family="mistral", tokenizer=True, sliding_window=64)
    with pytest.raises(ConfigError, match="sliding_window=64"):
        convert(src, tmp_path / "dst")
