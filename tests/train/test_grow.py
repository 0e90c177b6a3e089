import json

import pytest
import torch

from wedlm.testing import make_hf_checkpoint
from wedlm.train.grow import grow, grow_config, grow_state_dict
from wedlm.train.trainer import lineage


def test_grown_model_has_twice_the_layers_and_the_same_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", num_hidden_layers=2, tokenizer=True)
    dst = grow(src, tmp_path / "dst")
    assert json.loads((dst / "config.json").read_text())["num_hidden_layers"] == 4
    assert (dst / "tokenizer.json").is_file()
    a = AutoModelForCausalLM.from_pretrained(src).eval()
    b = AutoModelForCausalLM.from_pretrained(dst).eval()
    ids = torch.randint(0, a.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la, lb = a(ids).logits, b(ids).logits
    torch.testing.assert_close(lb, la, atol=1e-5, rtol=1e-5)
    sb = b.state_dict()
    assert not sb["model.layers.3.mlp.down_proj.weight"].any() and not sb["model.layers.1.self_attn.o_proj.weight"].any()
    assert torch.equal(sb["model.layers.2.self_attn.q_proj.weight"], sb["model.layers.3.self_attn.q_proj.weight"])
    # the new layers learn: the zeroed projections get a gradient
    b.train()
    b(ids, labels=ids).loss.backward()
    assert b.model.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    with pytest.raises(FileExistsError):
        grow(src, dst)


def test_grow_refuses_layers_it_cannot_start_as_identity():
    w = torch.ones(2, 2)
    with pytest.raises(ValueError, match="layer 0 lacks"):
        grow_state_dict({"model.layers.0.self_attn.o_proj.weight": w}, 1)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        grow_state_dict({"model.layers.3.mlp.down_proj.weight": w}, 2)


def test_grow_records_itself_in_the_lineage(tmp_path):
    first = {"stage": "ar", "steps": 10, "tokens": 40}
    config = {"num_hidden_layers": 4, "wedlm_training": {"stage": "wedlm", "run": "b", "steps": 7, "lineage": [first]}}
    grown = grow_config(config)
    assert grown["num_hidden_layers"] == 8 and config["num_hidden_layers"] == 4
    assert grown["wedlm_training"] == {"stage": "grow", "layers": [4, 8], "steps": 0, "tokens": 0,
                                       "lineage": [first, {"stage": "wedlm", "run": "b", "steps": 7}]}
    (tmp_path / "config.json").write_text(json.dumps(grown))
    assert [r["stage"] for r in lineage(str(tmp_path))] == ["ar", "wedlm", "grow"]
    assert "wedlm_training" not in grow_config({"num_hidden_layers": 2})
