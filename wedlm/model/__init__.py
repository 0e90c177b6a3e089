"""Qwen-family causal decoder with logical position ids, attention metadata and HF loading."""

from .attention import DenseAttention, KVCache, PagedAttention, SequenceSlice
from .config import ConfigError, ModelConfig, RopeConfig
from .loader import CheckpointError, load_model, resolve_dtype, save_model
from .qwen import QwenForCausalLM

__all__ = [
    "CheckpointError", "ConfigError", "DenseAttention", "KVCache", "ModelConfig", "PagedAttention",
    "QwenForCausalLM", "RopeConfig", "SequenceSlice", "load_model", "resolve_dtype", "save_model",
]
