"""Shared fixtures: tiny random checkpoints are written once per session."""

import os

import pytest
import torch

torch.set_num_threads(1)  # a training job may share the 2 cores; oversubscription collapses OpenMP
# Exactness tests compare float32 paths token for token; on a CPU with bf16 units the automatic
# choices would switch to bf16 autocast (its own tests force it with autocast=True / explicit flags).
# Set here, before any import of wedlm reads it, and inherited by spawned servers and TP workers.
os.environ.setdefault("WEDLM_CPU_BF16", "0")
# Likewise the float32 matmul kernel: BLAS everywhere (tests/engine/test_onednn_linear.py forces oneDNN).
os.environ.setdefault("WEDLM_CPU_LINEAR", "blas")
# The engine compiles its forward by default; compiling costs tens of seconds per graph on a busy
# core, so the suite runs eager unless a test asks for the compiled forward (enforce_eager=False).
os.environ.setdefault("WEDLM_ENFORCE_EAGER", "1")


@pytest.fixture(scope="session")
def ckpt_factory(tmp_path_factory):
    """make(name, **kwargs) -> folder; cached by name for the whole session."""
    from wedlm.testing import make_hf_checkpoint

    cache = {}

    def make(name, **kwargs):
        if name not in cache:
            cache[name] = make_hf_checkpoint(tmp_path_factory.mktemp(name), **kwargs)
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_wedlm(ckpt_factory):
    """The one tiny random WeDLM checkpoint the engine, serving and CLI tests share: Qwen3 style,
    byte tokenizer with ChatML (vocabulary 256, [MASK] = 255), seed 0."""
    return ckpt_factory("tiny_wedlm", family="qwen3", wedlm=True, tokenizer=True, seed=0)
