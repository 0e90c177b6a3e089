"""Tiny random Llama / Mistral checkpoints written by transformers' own `save_pretrained`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wedlm.testing import make_hf_checkpoint


def make_llama_checkpoint(out_dir: Path, family: str = "llama", seed: int = 0, init_std: float = 0.2,
                          tokenizer: bool = False, max_shard_size: str | None = None,
                          v4_rope_layout: bool = False, **overrides) -> Path:
    """A random LlamaForCausalLM / MistralForCausalLM (float32) saved to `out_dir` by
    `wedlm.testing.make_hf_checkpoint` (norm weights 1 + N(0, 0.1), biases N(0, 0.1));
    `v4_rope_layout` rewrites config.json's `rope_parameters` as transformers 4's
    `rope_theta` + `rope_scaling`.
    """
    out = make_hf_checkpoint(out_dir, family=family, seed=seed, max_shard_size=max_shard_size, init_std=init_std,
                             tokenizer=tokenizer, **overrides)
    if v4_rope_layout:
        raw = json.loads((out / "config.json").read_text())
        params = dict(raw.pop("rope_parameters"))
        raw["rope_theta"] = params.pop("rope_theta")
        if params.get("rope_type", "default") != "default":
            raw["rope_scaling"] = params
        (out / "config.json").write_text(json.dumps(raw, indent=2))
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
