"""Per-rank checkpoint loading: each rank reads only its own slices from the safetensors files.

The model is built on the meta device, sharded by `shard_model`, and every
parameter is filled from `safe_open(...).get_slice(name)[start:stop]`, which
reads only the slice's bytes (single-file and sharded-index checkpoints alike).
So a rank's host and device memory hold about 1/N of the weights; only the
norms are replicated.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from ...model import CheckpointError, QwenForCausalLM, resolve_dtype
from ...model.loader import finish_model, meta_model
from .sharding import ShardSlice, shard_model, shard_slice


def load_model_shard(path: str | Path, dtype: str | torch.dtype | None, device: str | torch.device,
                     rank: int, world_size: int) -> QwenForCausalLM:
    """The model of `rank` out of `world_size`, with only its slices loaded.

    Args:
        path: checkpoint folder (config.json, model.safetensors or a sharded index).
        dtype: float32 / bfloat16 / float16.
        device: where the slices go.
        rank, world_size: this rank and the number of ranks.

    Raises:
        FileNotFoundError: no folder / config.json.
        ConfigError: an unsupported config.
        ValueError: `world_size` cannot split the model (names both numbers).
        CheckpointError: a missing file or tensor, or a tensor whose full shape is
            not the config's (names the file and tensor).
    """
    torch_dtype = resolve_dtype(dtype)
    model, files = meta_model(path)
    config = model.config
    full_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}  # a tied lm_head is listed once
    shard_model(model, rank, world_size)
    slices = {n: shard_slice(n, config, rank, world_size) for n in full_shapes}
    state = {n: t.to(device=device, dtype=torch_dtype) for n, t in _read_slices(files, full_shapes, slices).items()}
    return finish_model(model, state, device)


def _read_slices(files: dict[str, Path], full_shapes: dict[str, tuple[int, ...]],
                 slices: dict[str, ShardSlice | None]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name in full_shapes:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for file, names in by_file.items():
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    view = f.get_slice(name)
                    shape = tuple(view.get_shape())
                    if shape != full_shapes[name]:
                        raise CheckpointError(f"{file}: tensor {name} has shape {shape}, "
                                              f"the config expects {full_shapes[name]}")
                    out[name] = _take(view, slices[name])
        except CheckpointError:
            raise
        except Exception as err:  # safetensors raises its own error types
            raise CheckpointError(f"{file}: cannot read tensor ({err})") from None
    return out


def _take(view, piece: ShardSlice | None) -> torch.Tensor:
    if piece is None:
        return view[:]
    if piece.dim == 0:
        return view[piece.start:piece.stop]
    return view[:, piece.start:piece.stop]
