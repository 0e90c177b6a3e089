"""Int8 weights on the CPU: dynamic int8 activations times int8 weights for every matmul.

`quantize_int8(model)` turns each `nn.Linear` of the model (q/k/v/o, gate/up/down and
lm_head) into an `Int8Linear`: its weight quantized once per output channel (symmetric,
scale = max |w| / 127 of the row), stored transposed as int8; each call quantizes every input
row on its own (symmetric, scale = max |x| / 127 of the row), multiplies in int8 with exact
int32 sums (`torch._int_mm`, torch's own int8 matrix product) and scales back to float32.

Why per row: a row's result then depends on that row alone, and integer sums do not depend on
how rows are grouped, so a request's logits are the same whatever else is in the forward. With
one activation scale per call (FBGEMM's dynamic linear, `torch.ops.quantized.linear_dynamic`)
the verify forward of `verified` quantized the anchor row with its drafts' scale, and `verified`
parted from `ar` on 1 of 40 held-out counting items (docs/experiments.md, 2026-12-06). torchao's
int8 dynamic-activation config does the same arithmetic behind a tensor subclass whose eager
dispatch was slower than float32 on five of six matmul shapes of this size; here it is a few
plain torch ops.

On a CPU without int8 dot-product instructions (`hardware.cpu_has_int8_units`: no VNNI or AMX,
e.g. an AVX2-only Zen 3) torch's int8 product is a slow generic loop (31x the time of the float32
product for [16, 192] x [192, 1024]); there the same integer products are summed by a float32
matmul on the int8 values held as floats (`fweight_t`). Every partial sum is an integer of at most
127^2 K in magnitude, which float32 holds exactly for K <= `EXACT_FLOAT_MAX_K` (1040), in any
summation order: the results are `torch._int_mm`'s bit for bit. Layers with more input
features keep `torch._int_mm`.

GGUF files are dequantized to float32 when they are read (`wedlm.model.source`), so a Q8_0
file's 32-weight blocks are requantized per output channel here: one scale per output row.

The float32 weights stay as the modules' parameters (state dict, tied embeddings, `model.dtype`
and `model.device` unchanged): memory grows by a quarter of the matmul weights.
"""

from __future__ import annotations

import torch
from torch import nn

from ..hardware import cpu_has_int8_units
from .defaults import QUANTIZATIONS
from .fast_model import PANEL_COLUMNS, one_row_linear, pack_panels, panel_linear

# the most input features for which a float32 matmul of int8 values sums exactly: every partial
# sum is at most 127^2 K < 2^24 in magnitude
EXACT_FLOAT_MAX_K = (1 << 24) // (127 * 127)


def int8_matmuls() -> str:
    """What runs the int8 matmuls on this CPU, for the engine's report."""
    if cpu_has_int8_units():
        return "int8 matmuls (torch._int_mm, int32 sums; activations per row, weights per channel)"
    return ("int8 matmuls as exact float32 sums of int8 values (no int8 dot-product instructions; "
            "activations per row, weights per channel)")


def check_quantization(value: str | None, device: torch.device | None = None, dtype: str | None = None) -> str | None:
    """`value` of the engine option `quantization`, checked: None (float weights), "int8" or "bf16".

    Args:
        value: the option.
        device: the resolved device, when known (both run on the CPU only).
        dtype: the weights' dtype, when known (both quantize float32 weights).

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


def int8_linear(x: torch.Tensor, qweight_t: torch.Tensor, wscale: torch.Tensor,
                bias: torch.Tensor | None = None, fweight_t: torch.Tensor | None = None,
                fpanels: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T + bias with x quantized per row and W per output channel, int8 x int8 -> int32.

    Args:
        x: float32 [rows, in_features].
        qweight_t: int8 [in_features, out_features], round(W / wscale) transposed.
        wscale: float32 [out_features].
        bias: float32 [out_features] or None.
        fweight_t: qweight_t as float32, or None: then the integer products are summed by a
            float32 matmul, exact for in_features <= EXACT_FLOAT_MAX_K (the caller's to check).
        fpanels: `pack_panels(fweight_t.t())` or None (needs fweight_t and the engine's C++
            operators): one row, and in compiled graphs 2 to FEW_ROWS_MAX rows, run
            `wedlm_cpu::few_rows_mm` on it (FMA chains of integers, exact alike).

    Returns:
        float32 [rows, out_features]; row i depends on x[i] alone; the same values on every path.
    """
    xscale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
    xq = torch.round(x / xscale)  # integers in [-127, 127]
    if fpanels is not None and xq.numel() == xq.shape[-1]:  # a symbolic size is never 1: no guard
        out = one_row_linear(xq, None, None, fpanels)
    elif fpanels is not None:
        out = panel_linear(xq, fweight_t.t(), None, fpanels)
    elif fweight_t is not None:
        out = torch.mm(xq, fweight_t)
    else:
        out = torch._int_mm(xq.to(torch.int8), qweight_t).float()
    out = out.mul_(xscale).mul_(wscale)
    return out if bias is None else out.add_(bias)


class Int8Linear(nn.Linear):
    """nn.Linear whose forward is `int8_linear` on an int8 copy of its weight (`pack`).

    Forward: x float32 [..., in_features] -> float32 [..., out_features].
    """

    qweight_t = None
    wscale = None
    fweight_t = None
    fpanels = None

    def pack(self) -> None:
        """Quantize the current weight: int8 [in, out] (`qweight_t`) and float32 scales [out]
        (`wscale`); on a CPU without int8 dot-product instructions, for at most EXACT_FLOAT_MAX_K
        input features, also the int8 values as float32 (`fweight_t`, the module's weight size
        again)."""
        w = self.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        self.qweight_t = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).t().contiguous()
        self.wscale = scale
        exact = self.in_features <= EXACT_FLOAT_MAX_K and not cpu_has_int8_units()
        self.fweight_t = self.qweight_t.float() if exact else None
        self.fpanels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = int8_linear(x.reshape(-1, self.in_features), self.qweight_t, self.wscale, self.bias, self.fweight_t,
                          self.fpanels)
        return out.view(*x.shape[:-1], self.out_features)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Make every plain `nn.Linear` of `model` an `Int8Linear` (in place) and return the model.

    For a float32 model on the CPU, before any fast-path module swap (the fused q/k/v and
    gate/up matmuls of `fast_model` read float weights directly). Idempotent.

    Raises:
        ValueError: the model's weights are not float32 or not on the CPU.
    """
    weight = next(model.parameters())
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"quantization='int8' needs float32 weights on the CPU, got {weight.dtype} on {weight.device}")
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = Int8Linear
            module.pack()
    return model


def is_int8(model: nn.Module) -> bool:
    """Whether `quantize_int8` made `model`'s matmuls `Int8Linear`s: each row of their results then
    depends on that row alone, bit for bit, whatever the rows beside it (`int8_linear`)."""
    return any(isinstance(module, Int8Linear) for module in model.modules())


def use_int8_panels(model: nn.Module) -> bool:
    """Give every `Int8Linear` that sums in float32 (`fweight_t`) a column-panel copy of those
    values (`fpanels`, `fast_model.pack_panels`; one more float32 copy of the weight), which the
    engine's C++ few-row matmul reads as it does a float32 model's (`int8_linear`). Needs the C++
    operators loaded (`fast_model.use_native_ops`); layers whose out_features are not multiples of
    PANEL_COLUMNS (16) are left alone. In place; returns whether any layer got panels."""
    done = False
    for module in model.modules():
        if (isinstance(module, Int8Linear) and module.fweight_t is not None
                and module.out_features % PANEL_COLUMNS == 0):
            module.fpanels = pack_panels(module.fweight_t.t())
            done = True
    return done
