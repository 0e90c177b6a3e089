"""The engine's model and runner for one process or N tensor-parallel ranks (the engine's only hook)."""

from __future__ import annotations

import torch

from ...model import QwenForCausalLM, load_model
from ..config import EngineConfig
from ..quantize import quantize_int8, use_int8_panels
from ..runner import ModelRunner


def load_engine_model(config: EngineConfig, device: torch.device, dtype: str) -> QwenForCausalLM:
    """The whole model, or rank 0's shard when `config.tensor_parallel_size` > 1.

    Raises:
        ValueError: the model's heads / intermediate size / vocabulary cannot be split
            by tensor_parallel_size, or too few GPUs (names both numbers); before any
            process starts.
        FileNotFoundError / ConfigError / CheckpointError: from the loader.
    """
    size = config.tensor_parallel_size
    if size == 1:
        return load_model(config.model, dtype=dtype, device=device)
    from .loading import load_model_shard
    from .runner import rank_devices

    return load_model_shard(config.model, dtype, rank_devices(device, size)[0], rank=0, world_size=size)


def make_engine_runner(model: QwenForCausalLM, num_blocks: int, config: EngineConfig,
                       device: torch.device, dtype: str, autocast: torch.dtype | None = None,
                       onednn_linear: bool = False, enforce_eager: bool = True,
                       quantization: str | None = None) -> ModelRunner:
    """A `ModelRunner` (compiled unless `enforce_eager`, the resolved `config.enforce_eager`; under
    `autocast`, oneDNN matmuls when `onednn_linear`, int8 or bf16 matmuls with `quantization`, the
    resolved `config.quantization`), or a
    `TensorParallelRunner` (compiled unless `enforce_eager`, no autocast) that starts ranks 1..N-1."""
    size = config.tensor_parallel_size
    if size == 1 and quantization == "int8":
        # the fused modules of the fast path read float weights, so int8 keeps the model's own modules
        runner = ModelRunner(quantize_int8(model), num_blocks, config.kv_block_size, fast_path=False,
                             enforce_eager=enforce_eager)
        if runner.native_ops:  # before the first call traces the compiled forward
            use_int8_panels(runner.model)
        return runner
    if size == 1:
        return ModelRunner(model, num_blocks, config.kv_block_size, config.fast_path,
                           enforce_eager=enforce_eager, autocast=autocast, onednn_linear=onednn_linear,
                           bf16_weights=quantization == "bf16")
    from .runner import TensorParallelRunner, rank_devices

    return TensorParallelRunner(model, num_blocks, config.kv_block_size, config.fast_path,
                                model_path=config.model, dtype=dtype, devices=rank_devices(device, size),
                                enforce_eager=enforce_eager)
