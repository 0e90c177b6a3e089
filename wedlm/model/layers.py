"""Building blocks of the Qwen-family decoder: RMSNorm, rotary embedding, SwiGLU MLP.

RoPE takes explicit *logical* position ids of any order: Topological Reordering
(docs/method.md, "Topological reordering"; paper Eq. 5-6) moves tokens physically while their
rotary phase keeps their logical position.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, RopeConfig, yarn_mscale


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); module names match the checkpoint tensors (bias: Llama's `mlp_bias`)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] (float32) and the cos/sin scale factor.

    default: theta^(-2i/d); dynamic: the same (NTK base growth starts past
    `max_position_embeddings`, beyond the engine's context limit); linear: divided by
    `factor`; llama3: long wavelengths divided by `factor`, blended smoothly between
    original/low_freq_factor and original/high_freq_factor; yarn: NTK-by-parts
    blend with a linear ramp between the correction dims for `beta_fast` /
    `beta_slow` rotations (arXiv 2309.00071 section 3.2).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    base_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type in ("default", "dynamic"):
        return base_freq, 1.0
    if rope.rope_type == "linear":
        return base_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(rope, base_freq), 1.0
    original = rope.original_max_position_embeddings or 4096
    low = _yarn_correction_dim(rope.beta_fast, head_dim, rope.theta, original)
    high = _yarn_correction_dim(rope.beta_slow, head_dim, rope.theta, original)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1.0 - ramp
    inv_freq = (base_freq / rope.factor) * ramp + base_freq * extrapolation_weight
    if rope.attention_factor is not None:
        scale = float(rope.attention_factor)
    elif rope.mscale and rope.mscale_all_dim:
        scale = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
    else:
        scale = yarn_mscale(rope.factor)
    return inv_freq, scale


def _llama3_inv_freq(rope: RopeConfig, base_freq: torch.Tensor) -> torch.Tensor:
    original = rope.original_max_position_embeddings or 8192
    wavelen = 2 * math.pi / base_freq
    scaled = torch.where(wavelen > original / rope.low_freq_factor, base_freq / rope.factor, base_freq)
    smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= original / rope.high_freq_factor) & (wavelen <= original / rope.low_freq_factor)
    return torch.where(medium, blended, scaled)


def _yarn_correction_dim(rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (rotations * 2 * math.pi))) / (2 * math.log(base))


class RotaryEmbedding(nn.Module):
    """Computes (cos, sin) for explicit position ids; shared by all layers.

    `tabulate(n)` keeps cos and sin of positions 0..n-1 as tables that `forward` then reads: the
    same values, without recomputing them. A compiled graph otherwise evaluates cos and sin again
    in every layer's fused kernel, for every head (torch inductor inlines pointwise producers
    into their consumers): 5-7% of the shipped model's batch-1 `wedlm` step on a Xeon core.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inv_freq, scale = rope_inv_freq(config.rope, config.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scale = scale
        self.register_buffer("cos_table", None, persistent=False)
        self.register_buffer("sin_table", None, persistent=False)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq  # [..., head_dim/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [..., head_dim]
        return angles.cos() * self.scale, angles.sin() * self.scale

    def tabulate(self, n_positions: int) -> None:
        """Keep float32 cos and sin [n_positions, head_dim] (8 * n_positions * head_dim bytes)
        for `forward`; positions it is given must then be in [0, n_positions)."""
        positions = torch.arange(n_positions, device=self.inv_freq.device)
        self.cos_table, self.sin_table = self._compute(positions)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: int64 [...] logical positions -> cos, sin [..., head_dim] in `dtype`."""
        if self.cos_table is not None:
            return self.cos_table[positions].to(dtype), self.sin_table[positions].to(dtype)
        cos, sin = self._compute(positions)
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: [..., heads, head_dim]; cos/sin: [..., head_dim]."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
