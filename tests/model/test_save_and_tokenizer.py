"""save_model round trip, tokenizer loading and stop ids."""

import json

import pytest
import torch

from wedlm.model import DenseAttention, load_model, save_model
from wedlm.tokenizer import load_tokenizer, mask_token_id, stop_token_ids


def test_save_model_round_trip(ckpt_factory, tmp_path):
    src = ckpt_factory("wedlm_qwen3_tied", family="qwen3", wedlm=True, tie_word_embeddings=True)
    model = load_model(src)
    out = save_model(model, tmp_path / "copy", extra_config={"note": "x"})
    again = load_model(out)
    ids = torch.arange(10)[None]
    with torch.no_grad():
        a = model(ids, ids, DenseAttention())
        b = again(ids, ids, DenseAttention())
    assert torch.equal(a, b)
    raw = json.loads((out / "config.json").read_text())
    assert raw["model_type"] == "wedlm" and raw["mask_token_id"] == 255 and raw["note"] == "x"
    assert not list(out.glob("*.tmp"))
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()


def test_tokenizer_stop_and_mask_ids(ckpt_factory, tmp_path):
    path = ckpt_factory("wedlm_tok", family="qwen3", wedlm=True, tokenizer=True)
    tok = load_tokenizer(path)
    vocab = tok.get_vocab()
    assert [vocab[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")] == [252, 253, 254, 255]
    assert stop_token_ids(tok, path) == [252, 254]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7]}))
    try:
        assert stop_token_ids(tok, path) == [7, 252, 254]
    finally:
        (path / "generation_config.json").unlink()
    assert mask_token_id(tok, None) == 255 and mask_token_id(tok, 9) == 9
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)


def test_loading_a_wedlm_tokenizer_prints_no_model_type_warning(ckpt_factory, capfd):
    """transformers does not know model_type "wedlm"; its warning must not reach every CLI run."""
    from transformers.utils import logging as hf_logging

    path = ckpt_factory("tok_warning_wedlm", family="qwen3", wedlm=True, tokenizer=True)
    before = hf_logging.get_verbosity()
    capfd.readouterr()
    load_tokenizer(path)
    assert "model of type" not in capfd.readouterr().err
    assert hf_logging.get_verbosity() == before
