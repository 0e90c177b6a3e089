"""Tokenizer, chat template and stop ids of a checkpoint folder (via transformers' AutoTokenizer).

Stop ids follow what the released WeDLM/Qwen checkpoints use: the
`eos_token_id` of generation_config.json (or config.json, or the tokenizer),
plus `<|im_end|>` and `<|endoftext|>` when the vocabulary has them
(docs/method.md, "The model and its checkpoint").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
MASK_TOKENS = ("<|mask|>", "[MASK]", "<mask>")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def has_tokenizer_files(folder: str | Path) -> bool:
    """Whether `folder` holds one of the files a transformers tokenizer loads from (`TOKENIZER_FILES`)."""
    return any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(path: str | Path):
    """`transformers.AutoTokenizer.from_pretrained(folder)` with a clear error; `path` may also be a
    .gguf file or a hub id (`wedlm.model.source.resolve_model`).

    Raises:
        FileNotFoundError: the folder has no tokenizer files.
        ModelSourceError: see `resolve_model`.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from .model.source import resolve_model

    path = resolve_model(path)
    if not has_tokenizer_files(path):
        raise FileNotFoundError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    # transformers does not know model_type "wedlm" and warns on every load that the config
    # may not fit the model class; only the tokenizer is read here, so that warning is noise.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(path))
    finally:
        hf_logging.set_verbosity(verbosity)


def read_json(path: Path) -> dict[str, Any]:
    """Parsed JSON object of `path`, or {} when the file does not exist.

    Raises:
        ValueError: the file is not JSON, or not a JSON object (the message names the file).
    """
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def stop_token_ids(tokenizer, path: str | Path) -> list[int]:
    """Sorted unique stop ids: generation_config/config eos ids, tokenizer eos, ChatML stops."""
    path = Path(path)
    ids: set[int] = set()
    for source in (read_json(path / "generation_config.json"), read_json(path / "config.json")):
        eos = source.get("eos_token_id")
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
            break
    if tokenizer is not None:
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in STOP_TOKENS if t in vocab)
    return sorted(ids)


def mask_token_id(tokenizer, config_mask_id: int | None) -> int | None:
    """The [MASK] id: config.json's `mask_token_id`, else a mask token in the vocabulary."""
    if config_mask_id is not None:
        return config_mask_id
    if tokenizer is None:
        return None
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return tokenizer.mask_token_id
    vocab = tokenizer.get_vocab()
    return next((vocab[t] for t in MASK_TOKENS if t in vocab), None)
