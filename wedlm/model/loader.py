"""Load and save HF-format checkpoints: `config.json` + safetensors (single or sharded).

The path may also be a `.gguf` file or a hub id: `source.resolve_model` turns it into a folder.

Errors are `CheckpointError`s that name the file and the tensor, never a
traceback from inside torch or safetensors.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import ConfigError, ModelConfig
from .layers import RotaryEmbedding
from .qwen import QwenForCausalLM
from .source import ModelSourceError, resolve_model

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded; the message names the file and tensor."""


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """"float32" / "bfloat16" / "float16" (or a torch dtype) -> torch dtype; None -> float32.

    Raises:
        ValueError: any other name.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype={dtype} is not supported; use float32, bfloat16 or float16")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def weight_files(path: Path) -> dict[str, Path]:
    """Map tensor name -> safetensors file holding it.

    Raises:
        CheckpointError: no weights, an unreadable index, or a shard named by the index missing.
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: not a valid safetensors index ({err})") from None
        files = {name: path / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise CheckpointError(f"{shard}: shard listed in {index.name} is missing")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json found")
    return {name: single for name in _tensor_names(single)}


def _tensor_names(file: Path) -> list[str]:
    try:
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"{file}: unreadable safetensors file ({err})") from None


def _read_tensors(files: dict[str, Path], wanted: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for file, names in by_file.items():
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    out[name] = f.get_tensor(name)
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"{file}: cannot read tensor ({err})") from None
    for name, shape in wanted.items():
        if tuple(out[name].shape) != tuple(shape):
            raise CheckpointError(
                f"{files[name]}: tensor {name} has shape {tuple(out[name].shape)}, "
                f"the config expects {tuple(shape)}")
    return out


def load_model(path: str | Path, dtype: str | torch.dtype | None = "float32",
               device: str | torch.device = "cpu", revision: str | None = None) -> QwenForCausalLM:
    """Build the model from a HF checkpoint folder, a .gguf file or a hub id (`source.resolve_model`).

    Args:
        path: folder with config.json and model.safetensors (or a sharded index), a .gguf
            file or a hub id `org/name`.
        dtype: float32, bfloat16 or float16.
        device: "cpu", "cuda", "cuda:1", ...
        revision: hub revision (hub ids only).

    Raises:
        FileNotFoundError: the folder or config.json does not exist.
        ModelSourceError: a file that is not .gguf, a bad GGUF file, a hub id that cannot be fetched.
        ConfigError: unsupported model_type / rope_scaling / sizes.
        CheckpointError: a missing or truncated file, a missing tensor, a wrong shape.
    """
    torch_dtype = resolve_dtype(dtype)
    model, files = meta_model(path, revision)
    expected = {n: p.shape for n, p in model.named_parameters()}  # tied lm_head is listed once
    tensors = _read_tensors(files, expected)
    return finish_model(model, {n: t.to(device=device, dtype=torch_dtype) for n, t in tensors.items()}, device)


def meta_model(path: str | Path, revision: str | None = None) -> tuple[QwenForCausalLM, dict[str, Path]]:
    """The model of a checkpoint (folder, .gguf file or hub id) on the meta device (no memory),
    and the file of each tensor.

    Raises:
        FileNotFoundError: the folder or config.json does not exist.
        ModelSourceError: see `source.resolve_model`.
        ConfigError: an unsupported config.
        CheckpointError: a parameter with no tensor in the weight files (names the files).
    """
    path = resolve_model(path, revision)
    config = ModelConfig.from_file(path)
    files = weight_files(path)
    with torch.device("meta"):
        model = QwenForCausalLM(config)
    missing = [n for n, _ in model.named_parameters() if n not in files]
    if missing:
        where = sorted({str(f) for f in files.values()})
        raise CheckpointError(f"{', '.join(where)}: missing tensor(s) {missing[:5]}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return model, files


def finish_model(model: QwenForCausalLM, state: dict[str, torch.Tensor],
                 device: str | torch.device) -> QwenForCausalLM:
    """Assign `state` (already on `device`, in its dtype) to a `meta_model`, tie the output
    layer to the embeddings where the config says so, build the rotary tables; eval mode."""
    model.load_state_dict(state, strict=False, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary = RotaryEmbedding(model.config).to(device)
    model.eval()
    return model


def save_model(model: QwenForCausalLM, out_dir: str | Path, extra_config: dict | None = None) -> Path:
    """Write config.json and model.safetensors into `out_dir` atomically (tmp file + rename).

    `extra_config` entries are merged into config.json (e.g. training metadata).
    Returns the folder.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    config = model.config.to_dict()
    config["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    config.update(extra_config or {})
    atomic_write(out / "model.safetensors", lambda p: save_file(state, p, metadata={"format": "pt"}))
    atomic_write(out / "config.json", lambda p: Path(p).write_text(json.dumps(config, indent=2) + "\n"))
    return out


def atomic_write(target: Path, write) -> None:
    """`write(path)` into a temporary file beside `target`, then renamed onto it: `target` is
    written whole or not at all (a write cut short, by an error or Ctrl-C, leaves no file and no
    temporary one). `write` gets the temporary path as a str."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


__all__ = ["CheckpointError", "ConfigError", "ModelSourceError", "atomic_write", "load_model", "save_model", "resolve_dtype",
           "weight_files"]
