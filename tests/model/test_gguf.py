"""GGUF files: a small random Llama written by the `gguf` package (Q8_0 matrices, float32 norms,
byte-level BPE vocabulary, ChatML template) loads in the engine with the same greedy tokens as
transformers loading the same file; the conversion is cached; bad files are clear errors."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.model import ModelSourceError, resolve_model

REPO = Path(__file__).resolve().parents[2]

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 256, 64, 2, 4, 2, 128
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for the `llama` architecture (transformers' reader undoes it)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(path, seed=0, arch="llama"):
    """A random Llama as GGUF: 2-D weights Q8_0-quantized, norms float32; tokenizer from
    `wedlm.testing.byte_tokenizer` (byte tokens, ChatML specials, chat template)."""
    import gguf

    from wedlm.testing import byte_tokenizer

    tok = byte_tokenizer(VOCAB)
    gen = torch.Generator().manual_seed(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-random-llama")
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives them from the scores
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(tok.chat_template)

    def rand(*shape, std=0.2):
        return (torch.randn(*shape, generator=gen) * std).numpy().astype(np.float32)

    def matrix(name, data):
        w.add_tensor(name, gguf.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    matrix("token_embd.weight", rand(VOCAB, HIDDEN))
    w.add_tensor("output_norm.weight", 1 + rand(HIDDEN, std=0.1))
    matrix("output.weight", rand(VOCAB, HIDDEN))
    head_dim = HIDDEN // HEADS
    shapes = {"attn_q.weight": (HEADS * head_dim, HIDDEN), "attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
              "attn_v.weight": (KV_HEADS * head_dim, HIDDEN), "attn_output.weight": (HIDDEN, HEADS * head_dim),
              "ffn_gate.weight": (FFN, HIDDEN), "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN)}
    for i in range(LAYERS):
        for name in ("attn_norm.weight", "ffn_norm.weight"):
            w.add_tensor(f"blk.{i}.{name}", 1 + rand(HIDDEN, std=0.1))
        for name, shape in shapes.items():
            data = rand(*shape)
            if name in ("attn_q.weight", "attn_k.weight"):
                data = _permute(data, HEADS if name == "attn_q.weight" else KV_HEADS)
            matrix(f"blk.{i}.{name}", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf")


@pytest.fixture(autouse=True)
def wedlm_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "wedlm-cache"
    monkeypatch.setenv("WEDLM_CACHE", str(cache))
    return cache


def test_engine_greedy_equals_transformers_on_the_same_file(gguf_file):
    from transformers import AutoModelForCausalLM

    llm = LLM(str(gguf_file), kv_block_size=4, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                              dtype=torch.float32).eval()
    prompts = [[5, 17, 99, 3], [200, 1, 1, 1, 42, 42, 7, 8, 9, 10, 11]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, decoding="ar", ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out["token_ids"] == ref
    assert len(set(outs[0]["token_ids"])) > 3  # not a degenerate repetition


def test_config_tokenizer_and_chat_template_come_from_the_file(gguf_file):
    folder = resolve_model(gguf_file)
    raw = json.loads((folder / "config.json").read_text())
    assert (raw["model_type"], raw["num_hidden_layers"], raw["num_key_value_heads"], raw["vocab_size"]) == \
        ("llama", LAYERS, KV_HEADS, VOCAB)
    llm = LLM(str(gguf_file), device="cpu")
    tok = llm.tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                   tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode("abc", add_special_tokens=False)) == "abc"
    assert tok.convert_tokens_to_ids("<|im_end|>") in llm.engine.stop_ids


def test_conversion_is_cached_and_atomic(gguf_file, wedlm_cache):
    first = resolve_model(gguf_file)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(gguf_file)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert first.is_relative_to(wedlm_cache / "gguf") and first.name == gguf_file.stem
    assert not [p for p in first.parent.parent.rglob(".tmp-*")]


def test_bad_gguf_files_are_clear_errors(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelSourceError, match="broken.gguf: not a readable GGUF file"):
        resolve_model(bad)
    other = write_llama_gguf(tmp_path / "other.gguf", arch="gpt2")
    with pytest.raises(ModelSourceError, match="GGUF architecture 'gpt2' is not supported"):
        resolve_model(other)
    with pytest.raises(FileNotFoundError, match="missing.gguf: .gguf file does not exist"):
        resolve_model(tmp_path / "missing.gguf")


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_gguf_files_equal_transformers(family, ckpt_factory, tmp_path):
    """Qwen2 (q/k/v bias) and Qwen3 (q/k norm) checkpoints written as float32 GGUF by the llama.cpp
    peer benchmark's writer (`wedlm.bench.gguf_export`) load with transformers' greedy tokens."""
    from transformers import AutoModelForCausalLM

    from wedlm.bench.gguf_export import write_gguf
    # random weights with the shipped model's byte-level BPE tokenizer (the writer needs its merges)
    # transformers' Qwen3 GGUF reader takes head_dim from Qwen3Config's default (128, every Qwen3's),
    # not from the file's key length
    shape = {"head_dim": 128} if family == "qwen3" else {}
    src = tmp_path / "src"
    shutil.copytree(ckpt_factory(f"gguf_{family}", family=family, seed=5, vocab_size=4096, **shape), src)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(REPO / "models" / "wedlm-tiny" / name, src / name)
    path = write_gguf(src, tmp_path / f"tiny-{family}.gguf")
    llm = LLM(str(path), kv_block_size=4, device="cpu")
    assert llm.engine.model.config.model_type == family
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    prompt = [5, 17, 990, 3, 42, 2000]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, decoding="ar", ignore_eos=True))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16, min_new_tokens=0,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert out["token_ids"] == ref
