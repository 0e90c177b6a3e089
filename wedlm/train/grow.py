"""Grow a checkpoint's depth without changing its outputs: `python -m wedlm.train.grow SRC DST`.

What: after every decoder layer i of SRC, insert a copy of layer i whose attention output
projection (`self_attn.o_proj`) and MLP down projection (`mlp.down_proj`) are zero, so
each new layer adds nothing to the residual stream and the grown model computes the same
logits as SRC (block expansion, as in LLaMA Pro, Wu et al. 2024). Training then opens the
new layers from that identity start, so a trained model gains depth while keeping what it
knows. `num_hidden_layers` doubles; every other file of SRC is copied unchanged.

Why: a 4-layer model counted right but never learned to compare the number it wrote with
the end value read from the prompt (docs/training.md, "The last-digit shortcut"); this is
how to test whether depth is what it lacks without retraining from scratch.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

ZEROED = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias")
LAYER = re.compile(r"^(.*\.layers)\.(\d+)\.(.+)$")


def grow_state_dict(state: dict, num_layers: int) -> dict:
    """The doubled state dict: layer i of `state` becomes layer 2i, and layer 2i + 1 is its copy
    with the ZEROED tensors set to zero. Tensors outside the layers are kept as they are.

    Args:
        state: name -> tensor of a Qwen-style checkpoint ("...layers.{i}.<rest>").
        num_layers: the checkpoint's `num_hidden_layers`.

    Raises:
        ValueError: a layer index >= `num_layers`, or a layer without o_proj / down_proj
            (the identity start needs both).
    """
    out: dict = {}
    zeroed: dict[int, set[str]] = {}
    for name, tensor in state.items():
        m = LAYER.match(name)
        if not m:
            out[name] = tensor
            continue
        prefix, i, rest = m.group(1), int(m.group(2)), m.group(3)
        if i >= num_layers:
            raise ValueError(f"{name}: layer {i} >= num_hidden_layers ({num_layers})")
        out[f"{prefix}.{2 * i}.{rest}"] = tensor
        copy = tensor.clone()
        if rest in ZEROED:
            copy.zero_()
            zeroed.setdefault(i, set()).add(rest.split(".")[1])
        out[f"{prefix}.{2 * i + 1}.{rest}"] = copy
    for i in range(num_layers):
        if zeroed.get(i, set()) != {"o_proj", "down_proj"}:
            raise ValueError(f"layer {i} lacks self_attn.o_proj or mlp.down_proj weights; cannot start the copy "
                             "as an identity")
    return out


def grow_config(config: dict) -> dict:
    """config.json of the grown model: `num_hidden_layers` doubled, per-layer fields of
    transformers configs kept per layer (`layer_types`: each entry twice; `max_window_layers`,
    the first layer index of sliding-window attention: doubled, so the same original layers use
    it). A training record (`wedlm_training`, see `wedlm.train.trainer.lineage`) becomes a
    "grow" record whose lineage ends with the source's own record, so the stages trained from
    the grown model carry the whole history, the growth included."""
    config = dict(config)
    n = int(config["num_hidden_layers"])
    config["num_hidden_layers"] = 2 * n
    meta = config.get("wedlm_training")
    if isinstance(meta, dict):
        own = {k: v for k, v in meta.items() if k != "lineage"}
        config["wedlm_training"] = {"stage": "grow", "layers": [n, 2 * n], "steps": 0, "tokens": 0,
                                    "lineage": [*meta.get("lineage", []), own]}
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = [t for t in config["layer_types"] for _ in (0, 1)]
    if isinstance(config.get("max_window_layers"), int):
        config["max_window_layers"] = 2 * config["max_window_layers"]
    return config


def grow(src: str | Path, dst: str | Path) -> Path:
    """Write SRC with twice the layers to DST (see the module docstring); returns DST.

    Raises:
        FileNotFoundError: SRC lacks config.json or model.safetensors.
        FileExistsError: DST already holds a model.safetensors (nothing is overwritten).
        ValueError: as `grow_state_dict`.
    """
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    for name in ("config.json", "model.safetensors"):
        if not (src / name).is_file():
            raise FileNotFoundError(f"{src / name} not found (a folder with config.json and model.safetensors)")
    if (dst / "model.safetensors").exists():
        raise FileExistsError(f"{dst / 'model.safetensors'} exists; pick an empty folder")
    config = json.loads((src / "config.json").read_text())
    state = grow_state_dict(load_file(src / "model.safetensors"), int(config["num_hidden_layers"]))
    config = grow_config(config)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copyfile(f, dst / f.name)
    tmp = dst / "model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in state.items()}, tmp, metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tmp.replace(dst / "model.safetensors")
    return dst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="checkpoint folder (config.json + model.safetensors)")
    p.add_argument("dst", help="new folder for the grown checkpoint")
    a = p.parse_args(argv)
    out = grow(a.src, a.dst)
    print(f"{out}: {json.loads((out / 'config.json').read_text())['num_hidden_layers']} layers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
