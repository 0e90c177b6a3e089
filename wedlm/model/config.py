"""Model configuration read from a Hugging Face `config.json`.

One dataclass covers the checkpoint families the engine loads
(docs/method.md, "The model and its checkpoint"; docs/checkpoints.md):

* `qwen2`  - Qwen2.5 style: bias on q/k/v projections, no q/k norm;
* `qwen3`  - Qwen3 style: per-head RMSNorm on q and k before RoPE, q/k/v/o bias
  only with `attention_bias`;
* `llama`, `mistral` - no q/k norm, q/k/v/o bias only with `attention_bias`,
  MLP bias only with `mlp_bias` (Mistral: no sliding window inside the context);
* `wedlm`  - any of these styles, chosen by `attention_bias` / `o_proj_bias` /
  `mlp_bias` / `qk_norm`, plus `mask_token_id` (the reserved [MASK] token).

Both the transformers 4 layout (`rope_theta`, `rope_scaling`) and the
transformers 5 layout (`rope_parameters`) are accepted. RoPE types: default,
linear, dynamic (NTK), llama3 and yarn.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "wedlm")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
# Mask id the released WeDLM checkpoints use when config.json lacks one (facts section 1).
DEFAULT_MASK_TOKEN_ID = 151665


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "wedlm": "WeDLMForCausalLM"}


class ConfigError(ValueError):
    """A config.json that the model cannot be built from; the message names the field."""


@dataclass(slots=True)
class RopeConfig:
    """Rotary embedding parameters.

    `rope_type` is "default", "linear" (positions divided by `factor`),
    "dynamic" (NTK-aware base growth past `max_position_embeddings`: inside the
    engine's context limit, which never exceeds it, the default frequencies),
    "llama3" (Llama 3.1: wavelengths above original/`low_freq_factor` divided by
    `factor`, a smooth blend up to original/`high_freq_factor`) or "yarn"
    (NTK-by-parts interpolation, arXiv 2309.00071, with cos/sin scaled by
    `attention_factor`).
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(
                f"rope_scaling.rope_type={self.rope_type!r} is not supported; "
                f"expected one of {SUPPORTED_ROPE_TYPES} or no rope_scaling"
            )
        if not self.theta > 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.theta}")
        if self.rope_type != "default" and not self.factor > 0:
            raise ConfigError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ConfigError(f"rope_scaling needs high_freq_factor > low_freq_factor > 0 for llama3, got "
                              f"{self.high_freq_factor} and {self.low_freq_factor}")


@dataclass(slots=True)
class ModelConfig:
    """Shape and style of a Qwen/Llama-family causal decoder (docs/method.md, "The model and its checkpoint").

    `attention_bias`: bias on q/k/v; `o_proj_bias`: bias on the attention output;
    `mlp_bias`: bias on gate/up/down; `qk_norm`: per-head RMSNorm on q and k.

    Raises:
        ConfigError: on an unknown `model_type`, an unsupported `rope_scaling`,
            a sliding window, a non-SiLU activation, or sizes that do not divide
            (heads vs KV heads).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True
    mask_token_id: int | None = None
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_id: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"model_type={self.model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id={self.mask_token_id} is outside vocab_size={self.vocab_size}")

    @property
    def is_wedlm(self) -> bool:
        return self.model_type == "wedlm"

    def to_dict(self) -> dict[str, Any]:
        """HF-style `config.json` fields (transformers 4 layout, readable by both 4 and 5)."""
        rope = self.rope
        out: dict[str, Any] = {
            "model_type": self.model_type,
            "architectures": [_ARCHITECTURES[self.model_type]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "o_proj_bias": self.o_proj_bias,
            "mlp_bias": self.mlp_bias,
            "qk_norm": self.qk_norm,
            "rope_theta": rope.theta,
            "torch_dtype": "float32",
        }
        if rope.rope_type != "default":
            out["rope_scaling"] = {
                "rope_type": rope.rope_type, "factor": rope.factor,
                "original_max_position_embeddings": rope.original_max_position_embeddings,
                "beta_fast": rope.beta_fast, "beta_slow": rope.beta_slow,
                "low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
            }
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if getattr(rope, key) is not None:
                    out["rope_scaling"][key] = getattr(rope, key)
        if self.mask_token_id is not None:
            out["mask_token_id"] = self.mask_token_id
        if self.eos_token_id:
            out["eos_token_id"] = self.eos_token_id if len(self.eos_token_id) > 1 else self.eos_token_id[0]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from the parsed JSON of a HF `config.json`."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"model_type={model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ConfigError(f"config.json lacks required field(s) {missing}")
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        _check_supported_options(raw)
        bias, o_bias, mlp_bias, qk_norm = _attention_style(raw)
        mask = raw.get("mask_token_id")
        if model_type == "wedlm" and mask is None and raw["vocab_size"] > DEFAULT_MASK_TOKEN_ID:
            mask = DEFAULT_MASK_TOKEN_ID
        eos = raw.get("eos_token_id")
        eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bias,
            o_proj_bias=o_bias,
            mlp_bias=mlp_bias,
            qk_norm=qk_norm,
            mask_token_id=mask,
            rope=_parse_rope(raw),
            eos_token_id=eos_list,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read `config.json` (or the `config.json` inside a folder).

        Raises:
            FileNotFoundError: the file does not exist.
            ConfigError: the JSON is invalid or describes an unsupported model.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json found")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: invalid JSON ({err})") from None
        try:
            return cls.from_dict(raw)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None


def _attention_style(raw: dict[str, Any]) -> tuple[bool, bool, bool, bool]:
    """(q/k/v bias, o_proj bias, MLP bias, q/k norm) of a config, by family."""
    model_type = raw["model_type"]
    bias = bool(raw.get("attention_bias", False))
    mlp_bias = bool(raw.get("mlp_bias", False))
    if model_type == "qwen2":
        return True, False, False, False
    if model_type == "qwen3":
        return bias, bias, False, True
    if model_type in ("llama", "mistral"):
        return bias, bias, mlp_bias if model_type == "llama" else False, False
    return bias, bool(raw.get("o_proj_bias", False)), mlp_bias, bool(raw.get("qk_norm", not bias))


def _check_supported_options(raw: dict[str, Any]) -> None:
    """Refuse what the decoder does not compute: a sliding window inside the context, an
    activation other than SiLU, partial rotary embeddings.

    Qwen configs carry `sliding_window` unused unless `use_sliding_window`; Mistral
    applies it whenever it is set, so a window shorter than `max_position_embeddings`
    (the engine's longest context) would change the attention.
    """
    window = raw.get("sliding_window")
    applies = raw["model_type"] in ("llama", "mistral") or raw.get("use_sliding_window")
    if applies and window is not None and window < raw.get("max_position_embeddings", 32768):
        raise ConfigError(f"sliding_window={window} is not supported (the engine attends to the whole context); "
                          "expected null or at least max_position_embeddings")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"hidden_act={act!r} is not supported; expected 'silu'")
    for source in ("rope_parameters", "rope_scaling"):
        params = raw.get(source)
        if isinstance(params, dict) and params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError(f"{source}.partial_rotary_factor={params['partial_rotary_factor']} is not "
                              "supported; expected 1.0")


def _parse_rope(raw: dict[str, Any]) -> RopeConfig:
    """Merge `rope_theta`/`rope_scaling` (transformers 4) and `rope_parameters` (5).

    Raises:
        ConfigError: a rope type outside SUPPORTED_ROPE_TYPES, naming the field it came from.
    """
    params: dict[str, Any] = {}
    source = "rope_scaling"
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(raw.get(key), dict):
            params.update(raw[key])
            if raw[key].get("rope_type", raw[key].get("type")) is not None:
                source = key
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"{source}.rope_type={rope_type!r} is not supported; "
                          f"expected one of {SUPPORTED_ROPE_TYPES} or no {source}")
    factor = params.get("factor")
    original = params.get("original_max_position_embeddings")
    if rope_type == "llama3" and original is None:
        original = raw.get("max_position_embeddings")
    if rope_type == "yarn" and factor is None and original:
        factor = raw.get("max_position_embeddings", original) / original
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(factor) if factor is not None else 1.0,
        original_max_position_embeddings=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=params.get("attention_factor"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
    )


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN attention temperature factor 0.1 * mscale * ln(scale) + 1 (arXiv 2309.00071 Eq. 22)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
