"""Tiny random checkpoints written by transformers' own `save_pretrained`.

Tests and benchmarks need real HF checkpoints but nothing can be downloaded, so
they are made here: a Qwen2 or Qwen3 model with random weights, saved exactly as
transformers writes it (optionally sharded), plus an optional `wedlm` variant
(config `model_type: "wedlm"`, `mask_token_id`). A minimal tokenizer can be
attached so the folder loads end to end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
# About 6M and 29M parameters (MEDIUM_40M keeps the "40M" name the engine benchmarks report it under).
SMALL_6M = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                tie_word_embeddings=True)
MEDIUM_40M = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                  tie_word_embeddings=True)
# About 158M parameters (the slot-cost curve's largest shape): 12 layers of width 1024.
LARGE_150M = dict(vocab_size=16384, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                  tie_word_embeddings=True)
# The shape of WeDLM-8B (Qwen3-8B): pass num_hidden_layers=N to reduce its depth (scripts/gpu_check.sh).
WEDLM_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=16384,
                rope_theta=1000000.0, tie_word_embeddings=False)


def make_hf_checkpoint(out_dir: str | Path, family: str = "qwen3", seed: int = 0,
                       max_shard_size: str | None = None, wedlm: bool = False,
                       mask_token_id: int | None = None, init_std: float = 0.2,
                       tokenizer: bool = False, **overrides: Any) -> Path:
    """Write a random `family` ("qwen2" | "qwen3" | "llama" | "mistral") checkpoint with transformers.

    Args:
        out_dir: target folder (created).
        seed: torch seed for the random init.
        max_shard_size: e.g. "50KB" to force a sharded checkpoint with an index.
        wedlm: rewrite config.json as `model_type: "wedlm"` with `mask_token_id`
            (default: vocab_size - 1) and the family's attention style flags.
        init_std: std of the normal init; larger than HF's 0.02 so logits are
            peaked enough to make greedy decoding non-trivial.
        tokenizer: also save a byte-level tokenizer (`byte_tokenizer`).
        overrides: config fields (hidden_size, head_dim, rope_theta, tie_word_embeddings, ...).

    Returns:
        The folder.
    """
    import transformers as tf

    classes = {"qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM), "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
               "llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "mistral": (tf.MistralConfig, tf.MistralForCausalLM)}
    if family not in classes:
        raise ValueError(f"family must be one of {tuple(classes)}, got {family!r}")
    config_cls, model_cls = classes[family]
    fields = dict(TINY)
    fields.update(overrides)
    torch.manual_seed(seed)
    config = config_cls(**fields)
    config.initializer_range = init_std
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
    out = Path(out_dir)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    if wedlm:
        raw = json.loads((out / "config.json").read_text())
        raw["model_type"] = "wedlm"
        raw["architectures"] = ["WeDLMForCausalLM"]
        raw["attention_bias"] = family == "qwen2"
        raw["qk_norm"] = family == "qwen3"
        raw["mask_token_id"] = fields["vocab_size"] - 1 if mask_token_id is None else mask_token_id
        (out / "config.json").write_text(json.dumps(raw, indent=2))
    if tokenizer:
        byte_tokenizer(fields["vocab_size"]).save_pretrained(out)
    return out


def byte_tokenizer(vocab_size: int = 256):
    """A `PreTrainedTokenizerFast` over bytes with ChatML specials in the top ids.

    Ids 0..vocab_size-5 are byte-level tokens (BPE with no merges); the top four ids are
    `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|mask|>`. Needs vocab_size >= 260
    for all 256 bytes; smaller vocabularies keep the first vocab_size - 4 bytes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    alphabet.sort()
    n_bytes = min(256, vocab_size - 4)
    vocab = {ch: i for i, ch in enumerate(alphabet[:n_bytes])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
    tok.add_special_tokens(specials)
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", mask_token="<|mask|>",
                                   additional_special_tokens=specials[1:3], chat_template=template)
