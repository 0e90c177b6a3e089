"""A checkpoint folder written as one GGUF file that llama.cpp loads: the peer's copy of the weights.

What: `gguf_arch(config)` picks llama.cpp's architecture for a config (`qwen3`: per-head q/k
RMSNorm, no q/k/v bias, the shipped model's layout; `qwen2`: q/k/v bias, no q/k norm;
`llama`: neither, Llama and Mistral checkpoints); `write_gguf(folder, out)` writes the tensors
under llama.cpp's names (`gguf`, llama.cpp's own writer package), the byte-level BPE vocabulary,
merges and special tokens; `weight_type="q8_0"` stores every matrix in llama.cpp's 8-bit format.

Why: `wedlm bench --peer llama.cpp` compares decoders on the same weights; float32 keeps
llama.cpp's arithmetic that of the engine's, so greedy answers can be compared token for token,
and Q8_0 is llama.cpp's counterpart of the engine's int8 weights (`quantization="int8"`).
"""

from __future__ import annotations

import json
from pathlib import Path

# HF tensor name (after "model.layers.N.") -> llama.cpp's GGUF name (after "blk.N.")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# how `write_gguf` stores the matrices: float32, llama.cpp's Q8_0 (blocks of 32 weights along a
# row, int8 with one float16 scale per block) or bf16 (rounded to nearest even); vectors (norm
# weights, biases) stay float32 in every case
GGUF_WEIGHT_TYPES = ("f32", "q8_0", "bf16")
Q8_0_BLOCK = 32
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


class GGUFExportError(ValueError):
    """The checkpoint has something this writer cannot put in a GGUF file llama.cpp reads; the
    message names the config field, tensor or tokenizer property."""


def gguf_arch(config: dict) -> str:
    """llama.cpp's architecture for an HF config dict: "qwen3", "qwen2" or "llama".

    `qk_norm` (default: model_type "qwen3") and `attention_bias` (default: model_type "qwen2")
    decide: q/k norm without bias is qwen3, bias without q/k norm qwen2, neither llama.

    Raises:
        GGUFExportError: both q/k norm and bias, a `rope_scaling`, or a sliding window in use
            (naming the field).
    """
    qk_norm = config.get("qk_norm", config.get("model_type") == "qwen3")
    bias = config.get("attention_bias", config.get("model_type") == "qwen2")
    if config.get("rope_scaling"):
        raise GGUFExportError(f"config.json: rope_scaling={config['rope_scaling']} is not written to GGUF "
                              "by this writer (plain RoPE only)")
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise GGUFExportError(f"config.json: rope_parameters.rope_type={rope['rope_type']!r} is not written to "
                              "GGUF by this writer (plain RoPE only)")
    if config.get("sliding_window") and config.get("use_sliding_window", config.get("model_type") == "mistral"):
        raise GGUFExportError(f"config.json: sliding_window={config['sliding_window']} is not written to GGUF "
                              "by this writer (full attention only)")
    if qk_norm and bias:
        raise GGUFExportError("config.json: no llama.cpp architecture has both qk_norm=True and attention_bias=True")
    return "qwen3" if qk_norm else "qwen2" if bias else "llama"


def _permute_rows(weight, heads: int):
    """llama.cpp's q/k row order for the `llama` architecture: per head, the two rotary halves
    interleaved (its RoPE pairs adjacent rows; HF's pairs row i with row i + head_dim / 2)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _bpe_tokenizer(model_dir: Path) -> dict:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE" or "merges" not in tok["model"]:
        raise GGUFExportError(f"tokenizer.json: model.type={tok['model']['type']!r}; only byte-level BPE "
                              "vocabularies with merges are written")
    return tok


def _tokenizer_fields(writer, model_dir: Path, vocab_size: int) -> None:
    """Vocabulary, token types, merges and the eos id (the smallest of the engine's stop ids)."""
    import gguf

    from wedlm.tokenizer import load_tokenizer, stop_token_ids

    tok = _bpe_tokenizer(model_dir)
    largest = max([*tok["model"]["vocab"].values(), *(a["id"] for a in tok.get("added_tokens", []))])
    if largest >= vocab_size:
        raise GGUFExportError(f"tokenizer.json: token id {largest} does not fit config.json's vocab_size={vocab_size}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in tok["model"]["vocab"].items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    writer.add_tokenizer_model("gpt2")
    # llama.cpp's `qwen2` pre-tokenizer splits text close to, not exactly like, this project's
    # tokenizers; the benchmark compares token ids, never text
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    stops = stop_token_ids(load_tokenizer(model_dir), model_dir)
    if stops:
        writer.add_eos_token_id(stops[0])
    writer.add_add_bos_token(False)


def _gguf_name(name: str) -> str:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    if name.startswith("model.layers."):
        idx, rest = name[len("model.layers."):].split(".", 1)
        if rest in LAYER_NAMES:
            return f"blk.{idx}.{LAYER_NAMES[rest]}"
    raise GGUFExportError(f"no llama.cpp name for tensor {name}")


def write_gguf(model_dir: str | Path, out: str | Path, weight_type: str = "f32") -> Path:
    """The checkpoint in `model_dir` as one GGUF file at `out` (returned; the shipped model: 90
    tensors, 16 MB in float32, 4.3 MB in Q8_0).

    Args:
        weight_type: "f32" (every tensor float32), "q8_0" (every matrix in Q8_0, vectors float32)
            or "bf16" (every matrix in bf16, vectors float32: llama.cpp's counterpart of the
            engine's `quantization="bf16"`).

    Raises:
        GGUFExportError: an architecture `gguf_arch` refuses, a tokenizer that is not byte-level BPE,
            a tensor with no llama.cpp name (biases of o_proj or the MLP, for instance), or, for
            "q8_0", a matrix whose rows are not a multiple of 32 long.
        ValueError: `weight_type` not in GGUF_WEIGHT_TYPES.
        FileNotFoundError: no config.json or tokenizer.json in `model_dir`.
    """
    import gguf
    from safetensors.torch import load_file

    if weight_type not in GGUF_WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {', '.join(GGUF_WEIGHT_TYPES)}, got {weight_type!r}")
    model_dir, out = Path(model_dir), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    arch = gguf_arch(config)
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    _bpe_tokenizer(model_dir)
    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    names = {name: _gguf_name(name) for name in sorted(tensors)}  # every refusal before the file is opened
    if weight_type == "q8_0":
        for name, t in tensors.items():
            if t.dim() == 2 and t.shape[1] % Q8_0_BLOCK:
                raise GGUFExportError(f"tensor {name} has rows of {t.shape[1]} weights; Q8_0 needs a multiple "
                                      f"of {Q8_0_BLOCK}")
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(model_dir.name)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    # transformers 5 keeps theta in rope_parameters, earlier versions at the top level
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[weight_type])
    _tokenizer_fields(w, model_dir, config["vocab_size"])
    for name, gname in names.items():
        data = tensors[name].float().numpy()
        if arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            data = _permute_rows(data, heads if "q_proj" in name else kv_heads)
        if weight_type != "f32" and data.ndim == 2:
            kind = gguf.GGMLQuantizationType.Q8_0 if weight_type == "q8_0" else gguf.GGMLQuantizationType.BF16
            w.add_tensor(gname, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            w.add_tensor(gname, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
