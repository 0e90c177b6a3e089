"""benchmarks/llama_cpp_peer.py's GGUF writer: the shipped model written and read back with `gguf`."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "wedlm-tiny"
gguf = pytest.importorskip("gguf")


def _peer():
    spec = importlib.util.spec_from_file_location("llama_cpp_peer", REPO / "benchmarks" / "llama_cpp_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _field(reader, key):
    return reader.fields[key].contents()


def _known_names(arch) -> set[str]:
    """Every tensor name llama.cpp's `arch` loads, for 8 blocks (gguf's own table)."""
    names = set()
    for t in gguf.MODEL_TENSORS[arch]:
        pattern = gguf.TENSOR_NAMES[t]
        names |= {pattern.format(bid=b) for b in range(8)} if "{bid}" in pattern else {pattern}
    return {f"{n}.{kind}" for n in names for kind in ("weight", "bias")}


def test_arch_from_config():
    peer = _peer()
    assert peer.gguf_arch({"model_type": "qwen3"}) == "qwen3"
    assert peer.gguf_arch({"model_type": "qwen2"}) == "qwen2"
    assert peer.gguf_arch({"model_type": "wedlm", "qk_norm": True, "attention_bias": False}) == "qwen3"
    with pytest.raises(SystemExit, match="qk_norm=True, attention_bias=True"):
        peer.gguf_arch({"qk_norm": True, "attention_bias": True})
    with pytest.raises(SystemExit, match="rope_scaling"):
        peer.gguf_arch({"model_type": "qwen3", "rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_shipped_model_round_trips(tmp_path):
    path = _peer().write_gguf(MODEL, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(path))
    config = json.loads((MODEL / "config.json").read_text())
    assert _field(reader, "general.architecture") == "qwen3"
    assert _field(reader, "qwen3.block_count") == config["num_hidden_layers"] == 8
    assert _field(reader, "qwen3.attention.key_length") == config["head_dim"] == 48
    assert _field(reader, "qwen3.attention.head_count_kv") == 2
    assert _field(reader, "qwen3.embedding_length") == 192
    assert _field(reader, "qwen3.feed_forward_length") == 512
    assert _field(reader, "qwen3.attention.head_count") == 4
    assert _field(reader, "qwen3.rope.freq_base") == pytest.approx(config["rope_theta"])
    assert _field(reader, "qwen3.attention.layer_norm_rms_epsilon") == pytest.approx(config["rms_norm_eps"])
    assert _field(reader, "tokenizer.ggml.model") == "gpt2" and _field(reader, "tokenizer.ggml.pre") == "qwen2"
    assert _field(reader, "tokenizer.ggml.eos_token_id") == 0
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[3] == gguf.TokenType.CONTROL and types[100] == gguf.TokenType.NORMAL
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == 4096 and tokens[3] == "<|mask|>" and tokens[2] == "<|im_end|>"
    tok = json.loads((MODEL / "tokenizer.json").read_text())
    assert len(_field(reader, "tokenizer.ggml.merges")) == len(tok["model"]["merges"]) == 3836
    weights = load_file(str(MODEL / "model.safetensors"))
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(got) == len(weights) == 90  # tied embeddings: no output.weight
    assert "output.weight" not in got
    assert set(got) <= _known_names(gguf.MODEL_ARCH.QWEN3)
    np.testing.assert_array_equal(got["token_embd.weight"], weights["model.embed_tokens.weight"])
    np.testing.assert_array_equal(got["blk.7.attn_q.weight"], weights["model.layers.7.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(got["blk.0.attn_k_norm.weight"], weights["model.layers.0.self_attn.k_norm.weight"])
    np.testing.assert_array_equal(got["blk.3.ffn_down.weight"], weights["model.layers.3.mlp.down_proj.weight"])


def test_table_and_plot(tmp_path):
    peer = _peer()
    rows = [{"prompt": "Count from 1 to 5.", "tokens": 14, "same": True, "llama eval": 1.0, "llama wall": 1.25,
             "eager": 5.0, "compiled": 2.5},
            {"prompt": "mean", "tokens": None, "same": None, "llama eval": 1.0, "llama wall": 1.25,
             "eager": 5.0, "compiled": 2.5}]
    md = peer.table(rows, "0.0.0", 3)
    assert "| Count from 1 to 5. | 14 | yes | 1.000 | 1.250 | 5.000 | 2.500 | 2.50x | 2.00x |" in md
    assert "| mean |  |  | 1.000 | 1.250 | 5.000 | 2.500 | 2.50x | 2.00x |" in md
    peer.plot(rows[:1], tmp_path / "img" / "p.png")
    assert (tmp_path / "img" / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_qwen2_checkpoint_with_biases(tmp_path):
    from wedlm.testing import make_hf_checkpoint

    ckpt = make_hf_checkpoint(tmp_path / "q2", family="qwen2", tokenizer=True, tie_word_embeddings=False)
    path = _peer().write_gguf(ckpt, tmp_path / "q2.gguf")
    reader = gguf.GGUFReader(str(path))
    assert _field(reader, "general.architecture") == "qwen2"
    weights = {}
    from safetensors.numpy import load_file as load
    for f in ckpt.glob("*.safetensors"):
        weights.update(load(str(f)))
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(got) == len(weights)
    assert set(got) <= _known_names(gguf.MODEL_ARCH.QWEN2)
    np.testing.assert_array_equal(got["blk.0.attn_q.bias"], weights["model.layers.0.self_attn.q_proj.bias"])
    np.testing.assert_array_equal(got["output.weight"], weights["lm_head.weight"])


def test_unknown_tensor_and_tokenizer_are_refused(tmp_path):
    from safetensors.numpy import save_file

    from wedlm.testing import make_hf_checkpoint

    ckpt = make_hf_checkpoint(tmp_path / "q3", family="qwen3", tokenizer=True)
    save_file({"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(4, np.float32)}, str(ckpt / "extra.safetensors"))
    with pytest.raises(SystemExit, match="no llama.cpp name for tensor model.layers.0.self_attn.rotary_emb.inv_freq"):
        _peer().write_gguf(ckpt, tmp_path / "a.gguf")
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    tok["model"]["type"] = "WordPiece"
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(SystemExit, match="only byte-level BPE"):
        _peer().write_gguf(ckpt, tmp_path / "b.gguf")
