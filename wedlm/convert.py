"""AR -> WeDLM checkpoint conversion (`wedlm convert SRC DST`).

What: a Qwen2/Qwen3/Llama/Mistral causal-LM checkpoint becomes a WeDLM checkpoint:
config.json gets `model_type: "wedlm"`, the attention-style flags its family
implies (`attention_bias`, `o_proj_bias`, `mlp_bias`, `qk_norm`) and
`mask_token_id`; the tokenizer gets the `<|mask|>` special token when it lacks
one. Its id falls inside the embedding for Qwen (one of the reserved rows); for
a vocabulary with no spare row (Llama-style: tokenizer size == vocab_size) the
embedding (and an untied output layer) grows to the next multiple of
`VOCAB_MULTIPLE` rows, the new rows set to the mean embedding. Otherwise weight
files are copied byte for byte: WeDLM changes no parameter (docs/method.md,
"The model and its checkpoint"); training then starts from the AR weights
(docs/method.md, "Training").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from wedlm.model.config import ModelConfig
from wedlm.model.source import resolve_model

MASK_TOKEN = "<|mask|>"
COPIED = ("generation_config.json",)
CONVERTIBLE = ("llama", "mistral", "qwen2", "qwen3", "wedlm")
# A grown vocabulary is padded to a multiple of this (tensor-parallel splits need a divisible vocabulary).
VOCAB_MULTIPLE = 64
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


class ConvertError(ValueError):
    """A source checkpoint that cannot be converted; the message says why."""


def _resolve_mask(src: Path, dst: Path, mask_token_id: int | None) -> int:
    """The [MASK] id; writes the tokenizer (with `<|mask|>` added if missing) into `dst`.

    Raises:
        ConvertError: no tokenizer and no explicit id.
    """
    from wedlm.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(src)
    except (OSError, ValueError) as err:
        if mask_token_id is None:
            raise ConvertError(f"{src}: no loadable tokenizer ({err}); pass --mask-token-id") from None
        return mask_token_id
    if MASK_TOKEN not in tok.get_vocab():
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
    elif tok.mask_token is None:
        tok.mask_token = MASK_TOKEN
    found = tok.convert_tokens_to_ids(MASK_TOKEN)
    tok.save_pretrained(str(dst))
    return found if mask_token_id is None else mask_token_id


def _grow_vocab(src: Path, dst: Path, weights: list[Path], vocab_size: int) -> list[Path]:
    """Write the weight files into `dst` with the embedding (and untied lm_head) grown to
    `vocab_size` rows (new rows: the mean embedding row); returns the files it wrote."""
    written = []
    for f in weights:
        if f.suffix == ".json":
            continue
        with safe_open(str(f), framework="pt") as handle:
            names = list(handle.keys())
            if not any(n in VOCAB_TENSORS for n in names):
                continue
            tensors = {n: handle.get_tensor(n) for n in names}
            metadata = handle.metadata()
        for name in VOCAB_TENSORS:
            if name in tensors:
                t = tensors[name]
                extra = t.float().mean(0, keepdim=True).to(t.dtype).expand(vocab_size - t.shape[0], -1)
                tensors[name] = torch.cat([t, extra]).contiguous()
        save_file(tensors, str(dst / f.name), metadata=metadata or {"format": "pt"})
        written.append(f)
    return written


def convert(src: str | Path, dst: str | Path, mask_token_id: int | None = None,
            revision: str | None = None) -> Path:
    """Write the WeDLM version of AR checkpoint `src` into `dst` (created); returns `dst`.

    Args:
        src: checkpoint folder (config.json with model_type qwen2 / qwen3 / llama / mistral /
            wedlm, safetensors weights), a .gguf file or a hub id (`wedlm.model.source`).
        dst: output folder; must differ from `src`.
        mask_token_id: force the [MASK] id (an existing row); default: the tokenizer's
            `<|mask|>` (added if missing; the vocabulary grows when it has no spare row).
        revision: hub revision when `src` is a hub id.

    Raises:
        ConvertError: unsupported model type, missing weights, a bad mask id, or a destination that
            is not a new or empty folder.
        FileNotFoundError / ModelSourceError: `src` cannot be found or has no config.json.
    """
    src, dst = resolve_model(src, revision), Path(dst)
    if src.resolve() == dst.resolve():
        raise ConvertError("destination must differ from the source checkpoint")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        # a checkpoint written among older files (a stale shard index, other weights) would not load
        raise ConvertError(f"{dst}: the destination exists and is not an empty folder; give a new or empty one")
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: no config.json")
    try:
        raw = json.loads((src / "config.json").read_text())
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ConvertError(f"{src / 'config.json'}: not a JSON file ({err})") from None
    family = raw.get("model_type")
    if family not in CONVERTIBLE:
        raise ConvertError(f"{src}: model_type {family!r} cannot be converted (expected one of {CONVERTIBLE})")
    weights = sorted(src.glob("*.safetensors")) + sorted(src.glob("model.safetensors.index.json"))
    if not weights:
        raise ConvertError(f"{src}: no safetensors weights")
    style = ModelConfig.from_dict(raw)  # validates and derives the attention style from the family
    if mask_token_id is not None and not 0 <= mask_token_id < raw["vocab_size"]:
        raise ConvertError(f"mask token id {mask_token_id} is outside the embedding (vocab_size={raw['vocab_size']})")
    made = next((p for p in reversed([dst, *dst.parents]) if not p.exists()), None)  # topmost new folder
    dst.mkdir(parents=True, exist_ok=True)
    try:
        _write(src, dst, raw, weights, style, mask_token_id)
    except BaseException:  # a failed conversion leaves no half-written checkpoint behind
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    return dst


def _write(src: Path, dst: Path, raw: dict, weights: list[Path], style: ModelConfig,
           mask_token_id: int | None) -> None:
    """Write tokenizer, weights, generation_config.json and the WeDLM config.json into `dst`."""
    mask_id = _resolve_mask(src, dst, mask_token_id)
    grown = []
    if mask_id >= raw["vocab_size"]:
        new_size = -(-(mask_id + 1) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        grown = _grow_vocab(src, dst, weights, new_size)
        raw["vocab_size"] = new_size
    raw.update(model_type="wedlm", architectures=["WeDLMForCausalLM"], attention_bias=style.attention_bias,
               o_proj_bias=style.o_proj_bias, mlp_bias=style.mlp_bias, qk_norm=style.qk_norm,
               mask_token_id=mask_id)
    for f in weights:
        if f not in grown:
            shutil.copyfile(f, dst / f.name)
    for name in COPIED:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
