"""Tiny random Llama / Mistral checkpoints written by transformers' own `save_pretrained`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from wedlm.testing import TINY, byte_tokenizer


def make_llama_checkpoint(out_dir: Path, family: str = "llama", seed: int = 0, init_std: float = 0.2,
                          tokenizer: bool = False, max_shard_size: str | None = None,
                          v4_rope_layout: bool = False, **overrides) -> Path:
    """A random LlamaForCausalLM / MistralForCausalLM (float32) saved to `out_dir`.

    Norm weights are 1 + N(0, 0.1) and biases N(0, 0.1) so every parameter matters;
    `v4_rope_layout` rewrites config.json's `rope_parameters` as transformers 4's
    `rope_theta` + `rope_scaling`.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM)}
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
    model.save_pretrained(out, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    if v4_rope_layout:
        raw = json.loads((out / "config.json").read_text())
        params = dict(raw.pop("rope_parameters"))
        raw["rope_theta"] = params.pop("rope_theta")
        if params.get("rope_type", "default") != "default":
            raw["rope_scaling"] = params
        (out / "config.json").write_text(json.dumps(raw, indent=2))
    if tokenizer:
        byte_tokenizer(fields["vocab_size"]).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def llama_factory(tmp_path_factory):
    """make(name, **kwargs) -> folder of `make_llama_checkpoint`; cached by name for the session."""
    cache = {}

    def make(name, **kwargs):
        if name not in cache:
            cache[name] = make_llama_checkpoint(tmp_path_factory.mktemp(name), **kwargs)
        return cache[name]

    return make
