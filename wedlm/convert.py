"""AR -> WeDLM checkpoint conversion (`wedlm convert SRC DST`).

What: a Qwen2/Qwen3 causal-LM checkpoint becomes a WeDLM checkpoint: config.json
gets `model_type: "wedlm"`, the attention-style flags (`attention_bias`,
`qk_norm`) its family implies, and `mask_token_id`; the tokenizer gets the
`<|mask|>` special token when it lacks one (its id must fall inside the
embedding, e.g. one of Qwen's reserved rows). Weight files are copied byte for
byte: WeDLM changes no parameter (docs/method.md, "The model and its checkpoint");
training then starts from the AR weights (docs/method.md, "Training").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from wedlm.model.config import ModelConfig

MASK_TOKEN = "<|mask|>"
COPIED = ("generation_config.json",)


class ConvertError(ValueError):
    """A source checkpoint that cannot be converted; the message says why."""


def _resolve_mask(src: Path, dst: Path, vocab_size: int, mask_token_id: int | None) -> int:
    """The [MASK] id; writes the tokenizer (with `<|mask|>` added if missing) into `dst`.

    Raises:
        ConvertError: no tokenizer and no explicit id, or a new token id outside the embedding.
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except (OSError, ValueError) as err:
        if mask_token_id is None:
            raise ConvertError(f"{src}: no loadable tokenizer ({err}); pass --mask-token-id") from None
        return mask_token_id
    if MASK_TOKEN not in tok.get_vocab():
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
    elif tok.mask_token is None:
        tok.mask_token = MASK_TOKEN
    found = tok.convert_tokens_to_ids(MASK_TOKEN)
    if mask_token_id is None:
        mask_token_id = found
    if not 0 <= mask_token_id < vocab_size:
        raise ConvertError(f"mask token id {mask_token_id} is outside the embedding (vocab_size={vocab_size})")
    tok.save_pretrained(str(dst))
    return mask_token_id


def convert(src: str | Path, dst: str | Path, mask_token_id: int | None = None) -> Path:
    """Write the WeDLM version of AR checkpoint `src` into `dst` (created); returns `dst`.

    Args:
        src: HF folder with config.json (model_type qwen2 / qwen3 / wedlm) and safetensors weights.
        dst: output folder; must differ from `src`.
        mask_token_id: force the [MASK] id; default: the tokenizer's `<|mask|>` (added if missing).

    Raises:
        ConvertError: unsupported model type, missing weights, or a bad mask id.
        FileNotFoundError: `src` has no config.json.
    """
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ConvertError("destination must differ from the source checkpoint")
    raw = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else None
    if raw is None:
        raise FileNotFoundError(f"{src}: no config.json")
    family = raw.get("model_type")
    if family not in ("qwen2", "qwen3", "wedlm"):
        raise ConvertError(f"{src}: model_type {family!r} cannot be converted (expected qwen2 or qwen3)")
    weights = sorted(src.glob("*.safetensors")) + sorted(src.glob("model.safetensors.index.json"))
    if not weights:
        raise ConvertError(f"{src}: no safetensors weights")
    dst.mkdir(parents=True, exist_ok=True)
    mask_id = _resolve_mask(src, dst, raw["vocab_size"], mask_token_id)
    style = ModelConfig.from_dict(raw)  # validates and derives bias / qk-norm from the family
    raw.update(model_type="wedlm", architectures=["WeDLMForCausalLM"], attention_bias=style.attention_bias,
               qk_norm=style.qk_norm, mask_token_id=mask_id)
    for f in weights:
        shutil.copyfile(f, dst / f.name)
    for name in COPIED:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return dst
