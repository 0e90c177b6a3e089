"""`wedlm bench --peer llama.cpp`: the GGUF writer (read back with `gguf`), the report, a smoke run
against llama.cpp whose answers equal llama.cpp's token ids, and the message when llama-cpp-python
is missing."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from wedlm.bench.gguf_export import GGUFExportError, gguf_arch, write_gguf

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "wedlm-tiny"
gguf = pytest.importorskip("gguf")


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
    assert gguf_arch({"model_type": "qwen3"}) == "qwen3"
    assert gguf_arch({"model_type": "qwen2"}) == "qwen2"
    assert gguf_arch({"model_type": "llama"}) == "llama"
    assert gguf_arch({"model_type": "wedlm", "qk_norm": True, "attention_bias": False}) == "qwen3"
    assert gguf_arch({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}) == "qwen2"
    with pytest.raises(GGUFExportError, match="both qk_norm=True and attention_bias=True"):
        gguf_arch({"qk_norm": True, "attention_bias": True})
    with pytest.raises(GGUFExportError, match="rope_scaling"):
        gguf_arch({"model_type": "qwen3", "rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(GGUFExportError, match="rope_parameters.rope_type='yarn'"):
        gguf_arch({"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}})
    with pytest.raises(GGUFExportError, match="sliding_window=4096"):
        gguf_arch({"model_type": "mistral", "sliding_window": 4096})


def test_shipped_model_round_trips(tmp_path):
    path = write_gguf(MODEL, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(path))
    config = json.loads((MODEL / "config.json").read_text())
    assert _field(reader, "general.architecture") == "qwen3"
    assert _field(reader, "qwen3.block_count") == config["num_hidden_layers"] == 8
    assert _field(reader, "qwen3.attention.key_length") == config["head_dim"] == 48
    assert _field(reader, "qwen3.rope.dimension_count") == 48
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


def _with_shipped_tokenizer(ckpt: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MODEL / name, ckpt / name)
    return ckpt


def test_qwen2_checkpoint_with_biases(tmp_path):
    from wedlm.testing import make_hf_checkpoint

    ckpt = make_hf_checkpoint(tmp_path / "q2", family="qwen2", tokenizer=True, tie_word_embeddings=False)
    path = write_gguf(ckpt, tmp_path / "q2.gguf")
    reader = gguf.GGUFReader(str(path))
    assert _field(reader, "general.architecture") == "qwen2"
    weights = {}
    for f in ckpt.glob("*.safetensors"):
        weights.update(load_file(str(f)))
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(got) == len(weights)
    assert set(got) <= _known_names(gguf.MODEL_ARCH.QWEN2)
    np.testing.assert_array_equal(got["blk.0.attn_q.bias"], weights["model.layers.0.self_attn.q_proj.bias"])
    np.testing.assert_array_equal(got["output.weight"], weights["lm_head.weight"])


def test_llama_checkpoint_rows_in_llama_cpp_order(tmp_path):
    """Llama's q/k rows are written in llama.cpp's rotary order (two halves interleaved per head);
    v and the rest as they are."""
    from wedlm.testing import make_hf_checkpoint

    ckpt = make_hf_checkpoint(tmp_path / "ll", family="llama", tokenizer=True)
    reader = gguf.GGUFReader(str(write_gguf(ckpt, tmp_path / "ll.gguf")))
    assert _field(reader, "general.architecture") == "llama"
    weights = load_file(str(next(ckpt.glob("*.safetensors"))))
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert set(got) <= _known_names(gguf.MODEL_ARCH.LLAMA)
    q = weights["model.layers.1.self_attn.q_proj.weight"]  # 4 heads of head_dim 16
    # llama.cpp's row 2i of a head is HF's row i, row 2i+1 is HF's row i + 8
    np.testing.assert_array_equal(got["blk.1.attn_q.weight"][0], q[0])
    np.testing.assert_array_equal(got["blk.1.attn_q.weight"][1], q[8])
    np.testing.assert_array_equal(got["blk.1.attn_q.weight"][17], q[24])
    k = weights["model.layers.0.self_attn.k_proj.weight"]  # 2 KV heads
    np.testing.assert_array_equal(got["blk.0.attn_k.weight"][19], k[25])
    np.testing.assert_array_equal(got["blk.0.attn_v.weight"], weights["model.layers.0.self_attn.v_proj.weight"])


def test_unknown_tensor_and_tokenizer_are_refused(tmp_path):
    from safetensors.numpy import save_file

    from wedlm.testing import make_hf_checkpoint

    ckpt = make_hf_checkpoint(tmp_path / "q3", family="qwen3", tokenizer=True)
    save_file({"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(4, np.float32)}, str(ckpt / "extra.safetensors"))
    with pytest.raises(GGUFExportError, match="no llama.cpp name for tensor model.layers.0.self_attn.rotary_emb.inv_freq"):
        write_gguf(ckpt, tmp_path / "a.gguf")
    assert not (tmp_path / "a.gguf").exists()  # refused before the file is opened
    (ckpt / "extra.safetensors").unlink()
    small = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(small, vocab_size=100)))
    with pytest.raises(GGUFExportError, match="token id 255 does not fit config.json's vocab_size=100"):
        write_gguf(ckpt, tmp_path / "c.gguf")
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    tok["model"]["type"] = "WordPiece"
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(GGUFExportError, match="model.type='WordPiece'; only byte-level BPE"):
        write_gguf(ckpt, tmp_path / "b.gguf")


def _result():
    """A peer result as `run_peer` returns it (two systems, one task)."""
    rows = [{"task": "arithmetic", "system": "llama.cpp", "decoding": "ar", "mode": None, "items": 2, "tokens": 20,
             "wall_s": 0.2, "tokens_per_s": 100.0, "tokens_per_forward": 1.0, "speedup_vs_llama_cpp": 1.0,
             "same_as_llama_cpp": 2, "repeats_wall_s": [0.2]},
            {"task": "arithmetic", "system": "wedlm eager", "decoding": "wedlm", "mode": "eager", "items": 2,
             "tokens": 20, "wall_s": 0.1, "tokens_per_s": 200.0, "tokens_per_forward": 5.5,
             "speedup_vs_llama_cpp": 2.0, "same_as_llama_cpp": 1, "repeats_wall_s": [0.1]}]
    return {"command": "wedlm bench --peer llama.cpp", "machine_line": "CPU X", "llama_cpp": "0.3.36",
            "model": "m", "engine": {"precision": "float32", "matmuls": "BLAS", "window_size": 16},
            "default_mode": "eager", "config": {"threads": 1, "repeats": 3}, "elapsed_s": 12.0,
            "created": "2026-12-06T00:00:00+00:00",
            "tasks": [{"name": "arithmetic", "kind": "reasoning", "max_tokens": 32, "items": 2, "prompts": []}],
            "results": rows}


def test_markdown_and_plot(tmp_path):
    from wedlm.bench.peer import peer_markdown, write_peer

    md = peer_markdown(_result())
    assert "| task (prompts) | llama.cpp AR | `wedlm eager` (default) | same answers |" in md
    assert "| arithmetic (2) | 1.00 | 2.00x (5.5 tok/fwd) | 1/2 |" in md
    assert "| arithmetic | wedlm eager | 20 | 100.0 | 200.0 | 5.50 | 1/2 | 2.00x |" in md
    paths = write_peer(_result(), tmp_path)
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(paths["json"].read_text())["results"][1]["speedup_vs_llama_cpp"] == 2.0
    assert paths["markdown"].read_text() == md


def test_missing_llama_cpp_is_a_clear_error(monkeypatch, capsys, tmp_path):
    """With llama_cpp hidden: stderr names the package and the pip command, exit status 2."""
    from wedlm.cli.main import main

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    code = main(["bench", "--peer", "llama.cpp", "--quick", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("wedlm bench: error: --peer llama.cpp needs the optional package llama_cpp: "
                          "pip install llama-cpp-python gguf")
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_unwritable_model_is_a_clear_error(capsys, tmp_path):
    pytest.importorskip("llama_cpp")
    from wedlm.cli.main import main
    from wedlm.testing import make_hf_checkpoint

    ckpt = make_hf_checkpoint(tmp_path / "ckpt", family="qwen3", tokenizer=True, attention_bias=True)
    capsys.readouterr()
    code = main(["bench", "--peer", "llama.cpp", "--quick", "--model", str(ckpt), "--out-dir", str(tmp_path / "o"),
                 "--enforce-eager", "--tasks", "arithmetic", "--max-tokens", "2"])
    assert code == 2
    assert capsys.readouterr().err.startswith(
        "wedlm bench: error: config.json: no llama.cpp architecture has both qk_norm=True and attention_bias=True")


def test_smoke_answers_equal_llama_cpp(tmp_path, capsys):
    """The command end to end on the shipped model: 2 prompts, few tokens, one repeat, eager only;
    every engine decoder's answer equals llama.cpp's token ids."""
    pytest.importorskip("llama_cpp")
    from wedlm.cli.main import main

    code = main(["bench", "--peer", "llama.cpp", "--quick", "--tasks", "arithmetic", "--max-tokens", "10",
                 "--repeats", "1", "--enforce-eager", "--out-dir", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "llama_cpp_peer.json").read_text())
    rows = {r["system"]: r for r in result["results"]}
    assert list(rows) == ["llama.cpp", "wedlm eager", "verified eager", "ar eager"]
    assert result["tasks"][0]["items"] == 2
    for r in rows.values():
        assert r["items"] == 2 and r["same_as_llama_cpp"] == 2 and r["tokens"] == rows["llama.cpp"]["tokens"] > 4
    assert rows["wedlm eager"]["tokens_per_forward"] > 1.5 and rows["ar eager"]["tokens_per_forward"] == 1.0
    assert (tmp_path / "img" / "bench_llama_cpp_peer.png").exists()
    assert "| arithmetic (2) | 1.00 |" in (tmp_path / "llama_cpp_peer.md").read_text()
    assert "arithmetic: wedlm eager" in capsys.readouterr().out


def test_smoke_llama_checkpoint_equals_llama_cpp(tmp_path):
    """A random Llama (the `llama` architecture, q/k rows permuted) decodes the same greedy tokens
    in llama.cpp and in the engine."""
    pytest.importorskip("llama_cpp")
    from wedlm import LLM, SamplingParams
    from wedlm.bench.peer import LlamaCppSystem
    from wedlm.testing import make_hf_checkpoint

    ckpt = _with_shipped_tokenizer(make_hf_checkpoint(tmp_path / "ll", family="llama", seed=5, vocab_size=4096,
                                                      tokenizer=True))
    peer = LlamaCppSystem(write_gguf(ckpt, tmp_path / "ll.gguf"), threads=1, n_ctx=64, stop_ids=set())
    llm = LLM(str(ckpt), device="cpu")
    try:
        for prompt in ([5, 17, 990, 3, 42, 2000], [100, 200, 300]):
            ours = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, decoding="ar", ignore_eos=True))
            assert ours[0]["token_ids"] == peer.generate(prompt, 12)["token_ids"]
    finally:
        peer.close()


def test_q8_0_matrices_round_trip_within_a_block_scale(tmp_path):
    """Q8_0: every matrix in llama.cpp's 8-bit blocks, dequantized within half a step of its block
    (step = max |w| / 127 over 32 weights) plus the float16 scale's rounding (2^-11 relative, over up
    to 127 steps: 0.062 of a step); vectors stay float32."""
    path = write_gguf(MODEL, tmp_path / "m.gguf", "q8_0")
    reader = gguf.GGUFReader(str(path))
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    weights = load_file(str(MODEL / "model.safetensors"))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 90
    q8 = gguf.GGMLQuantizationType.Q8_0
    for gname, hf in [("blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"),
                      ("token_embd.weight", "model.embed_tokens.weight")]:
        t = tensors[gname]
        assert t.tensor_type == q8
        w = weights[hf]
        got = gguf.quants.dequantize(np.asarray(t.data), q8).reshape(w.shape)
        blocks = np.abs(w).reshape(w.shape[0], -1, 32).max(-1, keepdims=True)
        step = np.repeat(blocks / 127, 32, axis=-1).reshape(w.shape)
        assert np.all(np.abs(got - w) <= (0.5 + 127 * 2.0 ** -11) * step)
        assert not np.array_equal(got, w)
    norm = tensors["blk.0.attn_k_norm.weight"]
    assert norm.tensor_type == gguf.GGMLQuantizationType.F32
    np.testing.assert_array_equal(np.asarray(norm.data), weights["model.layers.0.self_attn.k_norm.weight"])
    with pytest.raises(ValueError, match="weight_type must be one of f32, q8_0, bf16, got 'q4'"):
        write_gguf(MODEL, tmp_path / "x.gguf", "q4")


def test_bf16_matrices_are_the_weights_rounded_to_bf16(tmp_path):
    """bf16: every matrix rounded to bf16 as torch rounds it (llama.cpp's counterpart of the engine's
    `quantization="bf16"`), vectors float32; `peer_gguf_type` picks it beside bf16 weights."""
    import torch

    from wedlm.bench.peer import peer_gguf_type

    path = write_gguf(MODEL, tmp_path / "m.gguf", "bf16")
    reader = gguf.GGUFReader(str(path))
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_BF16
    weights = load_file(str(MODEL / "model.safetensors"))
    tensors = {t.name: t for t in reader.tensors}
    bf16 = gguf.GGMLQuantizationType.BF16
    for gname, hf in [("blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"),
                      ("token_embd.weight", "model.embed_tokens.weight")]:
        assert tensors[gname].tensor_type == bf16
        got = gguf.quants.dequantize(np.asarray(tensors[gname].data), bf16).reshape(weights[hf].shape)
        np.testing.assert_array_equal(got, torch.from_numpy(weights[hf]).bfloat16().float().numpy())
    assert tensors["blk.0.attn_k_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert [peer_gguf_type(q) for q in (None, "int8", "bf16")] == ["f32", "q8_0", "bf16"]


def test_q8_0_needs_rows_of_32(tmp_path):
    from wedlm.testing import make_hf_checkpoint

    ckpt = _with_shipped_tokenizer(make_hf_checkpoint(tmp_path / "c", family="qwen3", hidden_size=40,
                                                      vocab_size=4096, tokenizer=True))
    with pytest.raises(GGUFExportError, match="has rows of 40 weights; Q8_0 needs a multiple of 32"):
        write_gguf(ckpt, tmp_path / "c.gguf", "q8_0")
    assert not (tmp_path / "c.gguf").exists()


def test_smoke_int8_against_q8_0(tmp_path):
    """`--quantization int8`: llama.cpp runs the Q8_0 file; its own page, the engine's int8 forward."""
    pytest.importorskip("llama_cpp")
    from wedlm.cli.main import main

    code = main(["bench", "--peer", "llama.cpp", "--quick", "--tasks", "arithmetic", "--max-tokens", "10",
                 "--repeats", "1", "--enforce-eager", "--quantization", "int8",
                 "--out-dir", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "llama_cpp_peer_q8_0.json").read_text())
    assert result["gguf_type"] == "q8_0" and "int8" in result["engine"]["precision"]
    md = (tmp_path / "llama_cpp_peer_q8_0.md").read_text()
    assert md.startswith("# The engine's int8 weights against llama.cpp's Q8_0 of the same checkpoint\n")
    assert "(written as a Q8_0 (8-bit) GGUF file for llama.cpp)" in md
    assert "](img/bench_llama_cpp_peer_q8_0.png)" in md and (tmp_path / "img" / "bench_llama_cpp_peer_q8_0.png").exists()
    assert not (tmp_path / "llama_cpp_peer.json").exists()
    rows = {r["system"]: r for r in result["results"]}
    assert rows["ar eager"]["tokens"] > 4


def test_a_peer_that_dies_by_a_signal_is_loaded_without_extra_buffers(monkeypatch, tmp_path):
    """`extra_buffers_work` is False only when the probe's child dies by a signal (llama.cpp's AMX
    matmul segfaults on some CPUs, ggml-org/llama.cpp#20824); a child that raises is not a crash."""
    from wedlm.bench import peer

    path = tmp_path / "m.gguf"
    monkeypatch.setattr(peer, "PROBE_CODE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert peer.extra_buffers_work(path, 1) is False
    monkeypatch.setattr(peer, "PROBE_CODE", "raise SystemExit(1)")
    assert peer.extra_buffers_work(path, 1) is True
    # the child gets the file and the thread count
    monkeypatch.setattr(peer, "PROBE_CODE", "import os, signal, sys; sys.argv[1:] == [str(sys.argv[1]), '3'] "
                        "and sys.argv[1].endswith('m.gguf') and os.kill(os.getpid(), signal.SIGSEGV)")
    assert peer.extra_buffers_work(path, 3) is False
    assert peer.extra_buffers_work(path, 2) is True


def test_plain_buffers_decode_as_the_default(tmp_path):
    """llama.cpp without its extra CPU buffer types gives the same greedy tokens on the Q8_0 file,
    and the `use_extra_bufts` override is gone once the model is loaded."""
    pytest.importorskip("llama_cpp")
    import llama_cpp

    from wedlm.bench import peer

    path = write_gguf(MODEL, tmp_path / "m.gguf", "q8_0")
    plain = peer.llama_load(path, 1, 128, extra_buffers=False)
    assert llama_cpp.llama_model_default_params().use_extra_bufts is True
    prompt = plain.tokenize(b"Count from 1 to 5.")
    got = peer.llama_run(plain, prompt, 12, set())["tokens"]
    plain.close()
    if peer.extra_buffers_work(path, 1):
        default = peer.llama_load(path, 1, 128)
        assert peer.llama_run(default, prompt, 12, set())["tokens"] == got
        default.close()
    assert len(got) == 12


def test_a_hanging_probe_counts_as_a_crash_and_unknown_parameters_are_refused(monkeypatch, tmp_path):
    """A probe past its time limit falls back like a crash; a model parameter this
    llama-cpp-python does not have is an error, not a silently ignored attribute."""
    pytest.importorskip("llama_cpp")
    from wedlm.bench import peer

    monkeypatch.setattr(peer, "PROBE_CODE", "import time; time.sleep(30)")
    assert peer.extra_buffers_work(tmp_path / "m.gguf", 1, timeout_s=1) is False
    with pytest.raises(peer.PeerUnavailable, match="has no model parameter no_such_field"):
        with peer._default_model_params(no_such_field=True):
            pass
