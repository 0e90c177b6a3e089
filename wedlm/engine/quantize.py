"""Int8 weights on the CPU: dynamic int8 activations times int8 weights for every matmul.

`quantize_int8(model)` turns each `nn.Linear` of the model (q/k/v/o, gate/up/down and
lm_head) into an `Int8Linear`: its weight quantized once per output channel (symmetric,
scale = max |w| / 127 of the row) and prepacked for torch's own int8 CPU kernel
(`torch.ops.quantized.linear_dynamic`, FBGEMM on x86); each call quantizes the input rows
on the fly (one scale per call), multiplies in int8 with int32 sums and returns float32.

Why these kernels: on the shipped model's matmul shapes at one thread, FBGEMM's int8 linear
ran [16, 576] x [576, 1536] in about a fifth of float32's time and one-row products at one
half, while torchao 0.18's `Int8DynamicActivationInt8WeightConfig` (the library torch points
to for quantization) was 3-10x slower than float32 in eager mode on this CPU
(docs/experiments.md, 2026-12-06). torch marks its quantized tensors as deprecated
(pytorch/pytorch#184982); its warnings are silenced here, where they are expected.

GGUF files are dequantized to float32 when they are read (`wedlm.model.source`), so a Q8_0
file's 32-weight blocks are requantized per output channel here: FBGEMM takes one scale per
row, not per block.

The float32 weights stay as the modules' parameters (state dict, tied embeddings, `model.dtype`
and `model.device` unchanged): memory grows by a quarter of the matmul weights.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .defaults import QUANTIZATIONS

INT8_MATMULS = "int8 matmuls by FBGEMM (torch.ops.quantized.linear_dynamic)"


def check_quantization(value: str | None, device: torch.device | None = None, dtype: str | None = None) -> str | None:
    """`value` of the engine option `quantization`, checked: None (float weights) or "int8".

    Args:
        value: the option.
        device: the resolved device, when known ("int8" runs on the CPU only).
        dtype: the weights' dtype, when known ("int8" quantizes float32 weights).

    Raises:
        ValueError: naming `quantization` and what it allows.
    """
    if value is not None and value not in QUANTIZATIONS:
        raise ValueError(f"quantization must be None or one of {', '.join(map(repr, QUANTIZATIONS))}, got {value!r}")
    if value is None:
        return None
    if device is not None and device.type != "cpu":
        raise ValueError(f"quantization={value!r} runs on the CPU only, got device {str(device)!r}")
    if dtype is not None and dtype != "float32":
        raise ValueError(f"quantization={value!r} quantizes float32 weights, got dtype={dtype!r}")
    return value


class Int8Linear(nn.Linear):
    """nn.Linear whose forward is FBGEMM's dynamic int8 matmul on a prepacked int8 copy of the weight.

    Forward: x float32 [..., in_features] -> float32 [..., out_features]; the input rows are
    quantized to 8 bits with one scale per call (7-bit range, FBGEMM's `reduce_range` that
    keeps its int16 partial sums from overflowing on AVX2), the weight per output channel.
    """

    packed = None

    def pack(self) -> None:
        """Quantize and prepack the current weight (and keep the float32 bias in the pack)."""
        w = self.weight.detach().float().contiguous()
        scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zeros = torch.zeros(w.shape[0], dtype=torch.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
            bias = None if self.bias is None else self.bias.detach().float().contiguous()
            self.packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.quantized.linear_dynamic(flat, self.packed, True)
        return out.view(*x.shape[:-1], self.out_features)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Make every plain `nn.Linear` of `model` an `Int8Linear` (in place) and return the model.

    For a float32 model on the CPU, before any fast-path module swap (the fused q/k/v and
    gate/up matmuls of `fast_model` read float weights directly). Idempotent.

    Raises:
        ValueError: the model's weights are not float32 or not on the CPU, or this torch
            build has no int8 CPU engine (`torch.backends.quantized.supported_engines`).
    """
    weight = next(model.parameters())
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"quantization='int8' needs float32 weights on the CPU, got {weight.dtype} on {weight.device}")
    engines = torch.backends.quantized.supported_engines
    if not {"x86", "fbgemm", "onednn"} & set(engines):
        raise ValueError(f"quantization='int8' needs torch's x86 int8 engine; this build has {engines}")
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = Int8Linear
            module.pack()
    return model
