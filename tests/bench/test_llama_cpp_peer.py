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
    f = reader.fields[key]
    return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]


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
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == 4096 and tokens[3] == "<|mask|>" and tokens[2] == "<|im_end|>"
    tok = json.loads((MODEL / "tokenizer.json").read_text())
    assert len(_field(reader, "tokenizer.ggml.merges")) == len(tok["model"]["merges"]) == 3836
    weights = load_file(str(MODEL / "model.safetensors"))
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(got) == len(weights) == 90  # tied embeddings: no output.weight
    assert "output.weight" not in got
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
