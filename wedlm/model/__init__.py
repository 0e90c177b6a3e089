"""Qwen/Llama-family causal decoder with logical position ids, attention metadata and HF loading."""

from .attention import DenseAttention, KVCache, Padding, PagedAttention, SequenceSlice, as_tensor
from .config import ConfigError, ModelConfig, RopeConfig
from .loader import CheckpointError, atomic_write, load_model, resolve_dtype, save_model
from .qwen import QwenForCausalLM
from .source import ModelSourceError, resolve_model

__all__ = [
    "CheckpointError", "ConfigError", "DenseAttention", "KVCache", "ModelConfig", "ModelSourceError",
    "PagedAttention", "Padding", "QwenForCausalLM", "RopeConfig", "SequenceSlice", "as_tensor", "atomic_write", "load_model",
    "resolve_dtype", "resolve_model", "save_model",
]
