"""Inference fast path, applied from outside by swapping modules (the model stays plain PyTorch).

Batch-1 decoding of small models on CPU (and small batches on GPU) is bound by
per-op overhead, not FLOPs. `optimize_for_inference` swaps, in place:

* every RMSNorm by one `F.rms_norm` call (float32 models only, where it is the
  same arithmetic; low-precision models keep the reference's casts);
* each attention's q/k/v projections by one fused matmul, and q_norm/k_norm
  and RoPE applied without intermediate copies;
* each MLP's gate/up projections by one fused matmul.

The fused weights are plain tensors whose row slices become the original
parameters (views), so memory does not grow and the state dict is unchanged.
Apply it after the model is on its device (the fused tensors are not
parameters and do not follow `.to()`).

Under bf16 autocast, `precast_for_autocast` also keeps a bf16 copy of every matmul
weight: torch.autocast otherwise casts each fp32 weight to bf16 in every forward
(its cast cache lives for one autocast region), which made a one-slot forward
1.4-2.1x slower than fp32 on an AMX CPU (docs/engine.md). Same rounding, so the
same logits. On a CPU with AVX512-BF16, `use_panel_weights` then gives those bf16 copies column
panels for the engine's bf16 matmul (`bf16_panel_linear`), which streams them at the memory's
rate where oneDNN's one-row bf16 kernels did not (SmolLM2-135M: half the time per token).
On a CPU whose BLAS runs float32 matrix products slowly (`hardware.cpu_prefers_onednn_linear`:
MKL on an AMD Zen 4 core ran [32, 192] x [192, 1024] at half oneDNN's speed), `use_onednn_linear`
routes the float32 matmuls of at least `PACKED_MIN_MACS` multiply-adds through oneDNN, on weights
prepacked once in its blocked layout (same float32 arithmetic, another kernel; logits equal to within
float32 summation order).
On a CPU, float32 matmuls of one input row (the one-token step of batch-1 `ar` decoding) are
matrix-vector products bound by how fast the weights stream; `use_transposed_gemv` keeps one
more copy of each matmul weight transposed ([in_features, out_features], contiguous), on which
BLAS's x @ W^T runs 1.2-1.3x faster than F.linear on the [out, in] weight (AMD Zen 3, shipped
model, same greedy tokens; docs/engine.md, "One-row matmuls on transposed weights").
`tests/engine/test_fast_model.py` checks that logits match the reference.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..hardware import cpu_flags
from ..model.attention import use_cpu_attention
from ..model.layers import RMSNorm, SwiGLU, apply_rope
from ..model.memory import zeroed_cpu_tensor
from ..model.qwen import Attention, QwenForCausalLM
from . import native
from .buckets import FEW_ROWS_MAX, bucket

# Float32 matmuls with at least this many input rows go through oneDNN under `use_onednn_linear`;
# fewer rows stay with F.linear (BLAS's matrix-vector kernels were faster there: on a Zen 4 core,
# [1, 192] x [192, 1024] 12.5 us by MKL against 21-24 us by oneDNN, about even at 8 rows, 1.6x
# and 1.7x faster by oneDNN at 17 and 32 rows; docs/engine.md, "oneDNN matmuls"). This is the
# rule for a weight oneDNN has to read in PyTorch's layout; a prepacked weight (below) has its own,
# `PACKED_MIN_MACS`.
ONEDNN_MIN_ROWS = 16
# With the weight prepacked in oneDNN's blocked layout (`pack_weight`), a oneDNN call costs about
# 11 us plus its multiply-adds at about twice BLAS's rate, so the rule is per matmul: at least 2
# rows and rows * in_features * out_features >= PACKED_MIN_MACS (2^19, where the two met on a Zen 4
# core: 192x192 at 16 rows, 384x192 at 4-8, 1024x192 at 3, 4096x192 at 2).
# `python benchmarks/cpu_matmul.py` (one thread, Zen 4): the shipped model's matmuls (8 layers +
# lm_head) 468 us by BLAS at 2 rows, 429 by this rule; 652 against 489 at 3 rows, 1,541 against
# 906 at 16. Packing also saves oneDNN's reorder of the weight in every call: one layer +
# lm_head at 32 rows took 454 us unpacked and 379 packed (docs/engine.md, "Prepacked oneDNN weights").
PACKED_MIN_MACS = 1 << 19
# `use_transposed_gemv` costs one more copy of the matmul weights; models whose float32 matmul
# weights are larger than this keep F.linear alone. It pays on large models too: SmolLM2-135M
# (540 MB of matmul weights, a 113 MB tied lm_head) decoded batch-1 `ar` in 35.1 ms per token with
# the copies against 48.4 without (compiled, one Zen 4 thread, same tokens; docs/experiments.md).
TRANSPOSED_GEMV_MAX_BYTES = 2 << 30
# RoPE's cos and sin tables (`RotaryEmbedding.tabulate`, 8 bytes per position and head dimension)
# up to this size; a model with more positions x head_dim computes them in each forward
ROPE_TABLE_MAX_BYTES = 64 << 20
# columns of one panel of `pack_panels` (`few_rows_mm`'s tile width with AVX2, one zmm with AVX-512)
PANEL_COLUMNS = 16
# Compiled graphs with the C++ operators run the matmuls of 1 to FEW_ROWS_MAX rows (defined in
# `buckets.py`, whose unpadded row counts stop there too) by `wedlm_cpu::few_rows_mm` on a copy
# of the weight in column panels (`pack_panels`, 16 columns wide): register tiles at the core's
# FMA rate, no fixed cost per call. On a Zen 4 core (one thread,
# `python benchmarks/cpu_matmul.py`), the shipped model's matmuls (8 layers, each its own weights,
# + lm_head) took 0.62 ms against prepacked oneDNN's 1.76 at 2 rows, 1.61 against 2.39 at 16, 3.32
# against 4.21 at 38 and 9.97 against 10.97 at 128, 1.04x less at 512; SmolLM2-135M's (K = 576 and
# 1536) 1.21x less at 16 rows, 1.03x at 256, even at 512, where its lm_head ran 0.98-0.99x.
# `use_panel_weights` costs one more copy of the matmul weights; models whose float32 matmul
# weights are larger than this keep oneDNN for few rows.
PANELS_MAX_BYTES = 2 << 30
# bf16 matmuls (`bf16_panel_linear`) of more rows than this run on oneDNN where the CPU has AMX:
# its tile units beat `few_rows_mm`'s `vdpbf16ps` tiles from about 14 rows (SmolLM2-135M's matmuls,
# `python benchmarks/bf16_matmul.py`, one thread of a Xeon with AMX: 43.6 ms against 41 at 16 rows,
# 80.6 against 46.3 at 32, 26.4 against 39.5 at 8). Without AMX every bf16 matmul of up to FEW_ROWS_MAX rows takes the panels.
BF16_AMX_FEW_ROWS_MAX = 12
# `wedlm_cpu::linear`'s unpacked-oneDNN row threshold for a matmul that never takes oneDNN
# (`panel_linear`): rows beyond FEW_ROWS_MAX go to BLAS
_NO_ONEDNN_ROWS = 1 << 62
# `bf16_weight_linear`'s row limit for the panels: none (the same bf16 weights for every matmul)
_ALL_ROWS = 1 << 62
# `wedlm_cpu::linear`'s rule (packed_key, min_macs, min_rows, few_rows_max) of each caller, which
# `bind_linears` binds with the matmul: `panel_linear`'s, `bf16_weight_linear`'s, `onednn_linear`'s
_PANEL_RULE = (0, PACKED_MIN_MACS, _NO_ONEDNN_ROWS, FEW_ROWS_MAX)
_BF16_WEIGHT_RULE = (0, PACKED_MIN_MACS, _NO_ONEDNN_ROWS, _ALL_ROWS)


def _onednn_rule(packed_key: int) -> tuple[int, int, int, int]:
    return packed_key, PACKED_MIN_MACS, ONEDNN_MIN_ROWS, FEW_ROWS_MAX

# key -> weak reference to a prepacked weight (`pack_weight`). The module that owns the packed
# tensor holds the only strong reference, so a dropped engine frees it; the compiled graph sees
# the key, an int, never the packed tensor (oneDNN's opaque layout has no fake-tensor support).
_PACKED: dict[int, weakref.ref] = {}
_PACK_KEYS = itertools.count(1)
_LINEAR_POINTWISE = torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None
# The C++ oneDNN matmul compiled graphs call once `use_native_ops` loaded the C++ operators
# (else the Python one); not None also means `wedlm_cpu::one_row_mm` is there.
_native_linear = None
# the most rows of a bf16 matmul on bf16 panels, set by `use_panel_weights` for this CPU
_bf16_few_rows_max = FEW_ROWS_MAX
# whether the loaded C++ operators multiply bf16 panels (`bf16_panels_supported`), once asked
_bf16_kernel: bool | None = None
# Bound matmuls (`bind_linears`): model slot s binds keys s * SLOT_KEYS + 1, s * SLOT_KEYS + 2, ...
# A model takes the smallest free slot, so the first live model of a process binds the same keys
# in every process, and its graphs, which name the keys, load from the compile cache.
SLOT_KEYS = 1 << 16
_slots: set[int] = set()
# re-entrant: a model's finalizer (`_unbind_slot`) may run from a collection inside `bind_linears`
_slots_lock = threading.RLock()


def pack_weight(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A copy of `weight` ([out_features, in_features], float32, CPU) in oneDNN's blocked layout.

    Returns:
        (the packed tensor, its key for `onednn_linear(..., packed_key=key)`). The caller keeps
        the tensor alive; the key resolves to it while it lives (then to None: the call falls
        back to `weight`). The copy costs the weight's size in memory and is not updated if
        `weight` changes afterwards.
    """
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 32)
    key = next(_PACK_KEYS)
    _PACKED[key] = weakref.ref(packed, lambda _, k=key: _PACKED.pop(k, None))
    if _native_linear is not None:
        torch.ops.wedlm_cpu.remember(packed, key)
    return packed, key


def use_native_ops() -> bool:
    """Compiled graphs traced from now on call the C++ operators (`native.load`): the matmul
    `wedlm_cpu::linear` instead of the Python `wedlm::onednn_linear` (`few_rows_mm` on the
    column-panel copy up to FEW_ROWS_MAX rows, else the same rule and oneDNN call, with no call back
    into the interpreter per matmul) and, for one-row matmuls, `few_rows_mm` on the panels or
    `wedlm_cpu::one_row_mm` on transposed copies instead of BLAS, and
    `wedlm_cpu::one_query_attention` (the unmasked one-query attention of a batch-1 `ar` step)
    and `wedlm_cpu::window_attention` (every other step's) instead of SDPA
    (`attention.use_cpu_attention`). Every live
    prepacked weight's key is handed over (and every later one, by `pack_weight`). False, with
    nothing changed, when the C++ operators cannot be built."""
    global _native_linear
    if _native_linear is None and native.load():
        for key, ref in list(_PACKED.items()):
            packed = ref()
            if packed is not None:
                torch.ops.wedlm_cpu.remember(packed, key)
        _native_linear = torch.ops.wedlm_cpu.linear.default
        use_cpu_attention(torch.ops.wedlm_cpu.one_query_attention.default, torch.ops.wedlm_cpu.window_attention.default)
    return _native_linear is not None


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` of float32 CPU logits [n, V] (int64 [n]): the C++ `row_argmax` once
    `use_native_ops` made graphs call the operators (the same ids, torch's NaN rule included, in
    a tenth of torch's time for 16 x 4096), else torch's."""
    if _native_linear is not None and logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.ops.wedlm_cpu.row_argmax(logits)
    return logits.argmax(-1)


def _packed(key: int) -> torch.Tensor | None:
    ref = _PACKED.get(key) if key else None
    return None if ref is None else ref()


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  packed_key: int = 0, panels: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` by oneDNN for float32 inputs of enough rows.

    Args:
        x: [..., in_features]; rows = every leading index together.
        weight: [out_features, in_features], contiguous; bias: [out_features] or None.
        packed_key: `pack_weight(weight)`'s key (0: none): oneDNN then reads the prepacked copy
            and takes inputs of at least 2 rows and PACKED_MIN_MACS multiply-adds, else of
            at least ONEDNN_MIN_ROWS rows.
        panels: `pack_panels(weight)` or None: compiled graphs with the C++ operators run 2 to
            FEW_ROWS_MAX rows on it by `wedlm_cpu::few_rows_mm`.

    Returns:
        [..., out_features] in x's dtype. Other dtypes (a bf16 input under autocast) and fewer
        rows go to F.linear unchanged; eager inputs are padded with zero rows to a shape bucket
        (`buckets.bucket`) so that oneDNN sees few distinct shapes. Inside `torch.compile` every
        input of more than one row is an opaque operator (`wedlm_cpu::linear` in C++ once
        `use_native_ops` loaded it, else `wedlm::onednn_linear`) that applies the same row rule
        to the concrete row count at run time (a test in the graph would be a guard that splits
        graphs);
        the batch-1, one-query graph has one token and one logit row (`buckets.StepShape.of`)
        and calls F.linear.
    """
    if x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    if torch.compiler.is_compiling():
        # a symbolic size is never 1 (torch specialises 1): this test adds no guard
        if x.numel() == x.shape[-1]:
            return F.linear(x, weight, bias)
        # an opaque call: inductor's own lowering of the op asserts on unpacked, dynamic weights
        if _native_linear is not None:
            return _native_linear(x, weight, bias, panels, *_onednn_rule(packed_key))
        return _onednn_linear_op(x, weight, bias, packed_key)
    return _linear_rows(x, weight, bias, _packed(packed_key), pad=True)


def _packed_pays(rows: int, weight: torch.Tensor) -> bool:
    """The rule for a prepacked weight: at least 2 rows and PACKED_MIN_MACS multiply-adds."""
    return rows >= 2 and rows * weight.numel() >= PACKED_MIN_MACS


def _linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None,
                 pad: bool) -> torch.Tensor:
    features = x.shape[-1]
    rows = x.numel() // features
    if packed is None:
        if rows < ONEDNN_MIN_ROWS:
            return F.linear(x, weight, bias)
    elif not _packed_pays(rows, weight):
        return F.linear(x, weight, bias)
    # Zero rows pad the input to a shape bucket: oneDNN keeps a primitive (and scratch memory)
    # per input shape, and with every row count of a running engine its resident memory grew
    # without bound (shipped model, 200 rounds of 1-8 prompts of 8-307 tokens: +605 MB and
    # still growing; bucketed +86 MB, 14 MB of it over the last 100 rounds; BLAS +8 MB). Rows are
    # independent in a matmul, so the padding changes no real row's value. A compiled graph's
    # inputs are already bucket-padded by the runner.
    flat = x.reshape(rows, features)
    padded = bucket(rows) if pad else rows
    if padded != rows:
        flat = torch.cat([flat, flat.new_zeros(padded - rows, features)])
    out = _LINEAR_POINTWISE(flat, weight if packed is None else packed, bias, "none", [], "")
    return out[:rows].view(*x.shape[:-1], weight.shape[0])


def _onednn_linear_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       packed_key: int) -> torch.Tensor:
    packed = _packed(packed_key)
    # the compiled graph's common case first, with no reshapes or slices (each a dispatched op)
    if packed is not None and x.dim() == 2 and _packed_pays(x.shape[0], weight):
        return _LINEAR_POINTWISE(x, packed, bias, "none", [], "")
    return _linear_rows(x, weight, bias, packed, pad=False)


def _onednn_linear_fake(x, weight, bias, packed_key):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# The compiled graph's opaque matmul, an operator with a kernel for the CPU dispatch key alone.
# `torch.library.custom_op` would wrap it in autograd and Python-dispatch layers that the
# engine's inference-mode forward never needs: with them a compiled batch-1 step of the shipped
# model (31 calls) took 1.11-1.14x the time (one thread, AMD EPYC Zen 4; docs/experiments.md,
# "A lighter matmul operator and fewer guards"). Without an autograd kernel the op is for
# inference only.
_LIB = torch.library.Library("wedlm", "FRAGMENT")
_LIB.define("onednn_linear(Tensor x, Tensor weight, Tensor? bias, int packed_key) -> Tensor")
_LIB.impl("onednn_linear", _onednn_linear_cpu, "CPU")
torch.library.register_fake("wedlm::onednn_linear", _onednn_linear_fake, lib=_LIB)
_onednn_linear_op = torch.ops.wedlm.onednn_linear.default


def one_row_linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None = None,
                   panels: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight_t.T, bias)` for one input row, on the transposed weight.

    Args:
        x: [..., in_features] holding one row (x.numel() == in_features).
        weight_t: [in_features, out_features], contiguous (`use_transposed_gemv`'s copy), or None
            where `use_panel_weights` replaced it by `panels`.
        bias: [out_features] or None.
        panels: the same weight in column panels (`use_panel_weights`'s copy) or None.

    Returns:
        [..., out_features] in x's dtype; equal to F.linear within float32 summation order.
        Compiled graphs (once `use_native_ops` loaded the C++ operators) run
        `wedlm_cpu::few_rows_mm` on `panels` (while FEW_ROWS_MAX >= 1: the panels stream in
        order, 0.75-0.8x the time of the model's one-row matmuls on weight_t) or else
        `wedlm_cpu::one_row_mm` on weight_t (the same sums in the same order: equal values);
        eager calls BLAS on weight_t, or `few_rows_mm` on the panels when there is no weight_t.
    """
    if weight_t is None or (panels is not None and FEW_ROWS_MAX >= 1 and _native_linear is not None
                            and torch.compiler.is_compiling()):
        n = panels.numel() // x.shape[-1]
        return torch.ops.wedlm_cpu.few_rows_mm(x.reshape(1, -1), panels, n, bias).view(*x.shape[:-1], n)
    if _native_linear is not None and torch.compiler.is_compiling():
        out = torch.ops.wedlm_cpu.one_row_mm(x, weight_t)  # `native.py`: streams weights faster than BLAS
    else:
        out = torch.mm(x.reshape(1, -1), weight_t)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight_t.shape[1])


def _one_row(module: nn.Module, x: torch.Tensor) -> bool:
    """The module has a transposed copy (`use_transposed_gemv`) or column panels in its place
    (`use_panel_weights`) and x is one float32 row. Under torch.compile a symbolic size is never 1
    (torch specialises 1), so the test adds no guard: only the batch-1, one-query graph takes
    this path."""
    return ((module.weight_t is not None or module.weight_panels is not None) and x.dtype == torch.float32
            and x.numel() == x.shape[-1])


def _matmul(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, or `one_row_linear` on the module's transposed copy (`weight_t`) for one row
    once `use_transposed_gemv` made it, or `onednn_linear` (with the module's prepacked weight,
    `packed_key`) once `use_onednn_linear` set the module's `onednn`; both with the module's
    column panels (`weight_panels`) once `use_panel_weights` made them, which a module without
    oneDNN runs through `panel_linear`; bf16 panels go to `bf16_panel_linear` (a
    `precast_for_autocast`ed model, whose weights are bf16) or `bf16_weight_linear` (float32
    weights: `use_panel_weights(..., bf16=True)`). Inside a compiled graph, a module with float32
    weights and panels calls its bound matmul (`bind_linears`): the same operator on the same
    arguments, none of them a graph input."""
    if module.linear_key and x.dtype == torch.float32 and torch.compiler.is_compiling():
        return torch.ops.wedlm_cpu.bound_linear(x, module.linear_key, module.linear_n)
    if module.weight_panels is not None and module.weight_panels.dtype == torch.bfloat16:
        if weight.dtype == torch.bfloat16:  # a `precast_for_autocast`ed model under autocast
            return bf16_panel_linear(x, weight, bias, module.weight_panels)
        return bf16_weight_linear(x, weight, bias, module.weight_panels)
    if _one_row(module, x):
        return one_row_linear(x, module.weight_t, bias, module.weight_panels)
    if module.onednn:
        return onednn_linear(x, weight, bias, module.packed_key, module.weight_panels)
    if module.weight_panels is not None:
        return panel_linear(x, weight, bias, module.weight_panels)
    return F.linear(x, weight, bias)


def panel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 panels: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a matmul that BLAS runs (no oneDNN) but that has column
    panels (`use_panel_weights`): inside a compiled graph with the C++ operators, `wedlm_cpu::linear`
    runs 2 to FEW_ROWS_MAX rows by `few_rows_mm` on `panels` and more rows by BLAS (decided at run
    time from the concrete row count, as `onednn_linear`'s rule); elsewhere F.linear.

    Args:
        x: [..., in_features]; weight: [out_features, in_features]; bias: [out_features] or None;
        panels: `pack_panels(weight)`.

    Returns:
        [..., out_features], equal to F.linear within float32 summation order.
    """
    if (x.dtype == torch.float32 and _native_linear is not None and torch.compiler.is_compiling()
            and x.numel() != x.shape[-1]):  # a symbolic size is never 1: this test adds no guard
        return _native_linear(x, weight, bias, panels, *_PANEL_RULE)
    return F.linear(x, weight, bias)


def bf16_panel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      panels: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight, bias)` under bf16 autocast, for a matmul with bf16 column panels
    (`use_panel_weights` on a `precast_for_autocast`ed model, on a CPU with AVX512-BF16): x cast to
    bf16 as autocast casts it, then `wedlm_cpu::linear`, which runs 1 to FEW_ROWS_MAX rows
    (BF16_AMX_FEW_ROWS_MAX on a CPU with AMX) by `few_rows_mm` on `panels` (float32 sums of bf16
    products, rounded to bf16 once) and more rows by at::linear on `weight` (oneDNN), eager and
    compiled alike.

    Args:
        x: [..., in_features], any float dtype; weight: bf16 [out_features, in_features];
        bias: bf16 [out_features] or None; panels: `pack_panels(weight)`.

    Returns:
        bf16 [..., out_features]: autocast's F.linear within float32 summation order (an output
        may be one bf16 unit apart).
    """
    return _native_linear(x.to(torch.bfloat16), weight, bias, panels, 0, PACKED_MIN_MACS, _NO_ONEDNN_ROWS,
                          _bf16_few_rows_max)


def bf16_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       panels: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with bf16 weights and float32 activations (the engine's
    `quantization="bf16"`, `use_panel_weights(..., bf16=True)`): x rounded to bf16 (nearest even),
    products of bf16 pairs summed in float32 and returned unrounded, by `few_rows_mm` on the bf16
    `panels` for every row count (the weights every matmul reads are the same bf16 values).

    Args:
        x: float32 [..., in_features]; weight: the float32 weight [out_features, in_features]
            (for the shape only); bias: float32 [out_features] or None; panels:
            `pack_panels(weight.to(torch.bfloat16))`.

    Returns:
        float32 [..., out_features]: sum_k bf16(x[k]) bf16(w[n, k]) in float32, plus the bias.
    """
    return _native_linear(x, weight, bias, panels, *_BF16_WEIGHT_RULE)


class OneDNNLinear(nn.Linear):
    """nn.Linear whose matmul is `_matmul`'s choice: `onednn_linear` (on the prepacked weight
    `packed_key`, if set), or `one_row_linear` for one row once `weight_t` is set."""

    onednn = True
    packed_key = 0
    weight_t = None
    weight_panels = None
    linear_key = linear_n = 0  # `bind_linears`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _matmul(self, x, self.weight, self.bias)


class TransposedGemvLinear(nn.Linear):
    """nn.Linear without oneDNN whose matmul is `_matmul`'s choice: one-row inputs on its transposed
    copy `weight_t` (`use_transposed_gemv`) or on its column panels (`use_panel_weights`), which
    compiled graphs also run 2 to FEW_ROWS_MAX rows on (`panel_linear`)."""

    onednn = False
    packed_key = 0
    weight_t = None
    weight_panels = None
    linear_key = linear_n = 0  # `bind_linears`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _matmul(self, x, self.weight, self.bias)


class FusedRMSNorm(RMSNorm):
    """RMSNorm as one `F.rms_norm` call (float32 only: identical arithmetic).

    Under bf16 autocast the input is bf16 while the weight stays float32: then it normalizes
    in float32, casts back and multiplies by the weight, as the reference `RMSNorm` does
    (F.rms_norm with mixed dtypes falls back to an unfused path and warns on every run).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:
            return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class FusedQKVAttention(Attention):
    """Attention with one [q; k; v] projection matmul (by oneDNN once `onednn` is set; on the
    transposed copy `weight_t` for one row once `use_transposed_gemv` made it)."""

    onednn = False
    packed_key = 0
    weight_t = None
    weight_panels = None
    linear_key = linear_n = 0  # `bind_linears`

    def fuse(self) -> None:
        weights = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        self.qkv_weight = _fuse_params(weights)
        for lin, view in zip((self.q_proj, self.k_proj, self.v_proj), _row_views(self.qkv_weight, weights)):
            lin.weight = view
        self.qkv_bias = None
        if self.q_proj.bias is not None:
            biases = [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]
            self.qkv_bias = _fuse_params(biases)
            for lin, view in zip((self.q_proj, self.k_proj, self.v_proj), _row_views(self.qkv_bias, biases)):
                lin.bias = view
        self.split_sizes = [w.shape[0] for w in weights]

    def forward(self, x, cos, sin, attn):
        lead = x.shape[:-1]
        q, k, v = _matmul(self, x, self.qkv_weight, self.qkv_bias).split(self.split_sizes, dim=-1)
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn.attend(self.layer_idx, q, k, v, self.scale)
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))


class FusedSwiGLU(SwiGLU):
    """SwiGLU with one [gate; up] projection matmul (by oneDNN once `onednn` is set; on the
    transposed copy `weight_t` for one row once `use_transposed_gemv` made it)."""

    onednn = False
    packed_key = 0
    weight_t = None
    weight_panels = None
    linear_key = linear_n = 0  # `bind_linears`

    def fuse(self) -> None:
        weights = [self.gate_proj.weight, self.up_proj.weight]
        self.gate_up_weight = _fuse_params(weights)
        for lin, view in zip((self.gate_proj, self.up_proj), _row_views(self.gate_up_weight, weights)):
            lin.weight = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = _matmul(self, x, self.gate_up_weight).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class PrecastLinear(nn.Linear):
    """nn.Linear whose matmul reads a low-precision copy of its weight and bias (`weight16`, `bias16`),
    or its column panels once `use_panel_weights` made them (`bf16_panel_linear`)."""

    weight_panels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_panels is not None:
            return bf16_panel_linear(x, self.weight16, self.bias16, self.weight_panels)
        return F.linear(x, self.weight16, self.bias16)


def precast_for_autocast(model: QwenForCausalLM, dtype: torch.dtype) -> QwenForCausalLM:
    """Keep a `dtype` copy of every matmul weight of an `optimize_for_inference`d model (in place).

    For running under `torch.autocast(dtype=dtype)`: the copies are what autocast would cast
    the float32 weights to in every forward (round to nearest), made once, so the logits are
    identical and the per-forward casts are gone. Embeddings, norms and the KV cache stay
    float32; the parameters and the state dict are unchanged (the copies are plain tensors,
    costing half the float32 matmul weights in extra memory). Idempotent; a no-op for a model
    whose weights are not float32.
    """
    if model.dtype != torch.float32:
        return model
    fused_parts = {id(lin) for module in model.modules() for lin in _fused_projections(module)}
    for module in model.modules():
        if isinstance(module, FusedQKVAttention) and module.qkv_weight.dtype != dtype:
            module.qkv_weight = module.qkv_weight.to(dtype)
            module.qkv_bias = None if module.qkv_bias is None else module.qkv_bias.to(dtype)
        elif isinstance(module, FusedSwiGLU) and module.gate_up_weight.dtype != dtype:
            module.gate_up_weight = module.gate_up_weight.to(dtype)
        elif type(module) is nn.Linear and id(module) not in fused_parts:
            module.weight16 = module.weight.detach().to(dtype)
            module.bias16 = None if module.bias is None else module.bias.detach().to(dtype)
            module.__class__ = PrecastLinear
    return model


def use_onednn_linear(model: QwenForCausalLM, prepack: bool = True) -> QwenForCausalLM:
    """Route the float32 matmuls of an `optimize_for_inference`d CPU model through `onednn_linear`.

    In place: the fused q/k/v and gate/up matmuls, every other nn.Linear (o_proj, down_proj,
    lm_head). With `prepack` each matmul weight also gets a copy in oneDNN's blocked layout
    (`pack_weight`; memory: one more copy of the matmul weights, 9.6 MB for the shipped model),
    which makes oneDNN faster and worth it from PACKED_MIN_MACS multiply-adds; the copies are made once,
    so weights changed afterwards need another call. Parameters and state dict unchanged.
    Idempotent (a second call packs afresh); a no-op for weights that are not float32 or not on
    the CPU (and for `precast_for_autocast`ed models, whose matmuls run in bf16).

    Raises:
        RuntimeError: this torch build has no oneDNN (`torch.backends.mkldnn.is_available()`).
    """
    if model.dtype != torch.float32 or model.device.type != "cpu":
        return model
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("use_onednn_linear needs a torch build with oneDNN (torch.backends.mkldnn)")
    targets = _matmuls(model)
    if any(weight.dtype != torch.float32 for _, weight in targets):
        return model
    for module, weight in targets:
        if isinstance(module, (FusedQKVAttention, FusedSwiGLU)):
            module.onednn = True
        else:
            module.__class__ = OneDNNLinear
        if prepack:
            module.packed_weight, module.packed_key = pack_weight(weight)
    if getattr(model, "linear_slot", None) is not None:  # panels bound before: bind the oneDNN rule
        bind_linears(model)
    return model


def use_transposed_gemv(model: QwenForCausalLM, max_bytes: int = TRANSPOSED_GEMV_MAX_BYTES) -> bool:
    """Give every matmul of an `optimize_for_inference`d CPU float32 model a transposed copy of
    its weight for one-row inputs (`one_row_linear`); in place. Returns whether it did.

    The fused q/k/v and gate/up matmuls, o_proj, down_proj and lm_head (a tied lm_head gets its
    own copy; the embedding is untouched). Memory: one more copy of the matmul weights (16 MB for
    the shipped model); models whose matmul weights exceed `max_bytes` are left alone, as are
    weights that are not float32 or not on the CPU, and `precast_for_autocast`ed models. Inputs
    of two or more rows keep their kernel (F.linear or oneDNN). The copies are made once:
    weights changed afterwards need another call. Parameters and state dict unchanged; idempotent.
    """
    if model.dtype != torch.float32 or model.device.type != "cpu":
        return False
    targets = _matmuls(model)
    if any(weight.dtype != torch.float32 for _, weight in targets):
        return False
    if not targets or sum(w.numel() * w.element_size() for _, w in targets) > max_bytes:
        return False
    for module, weight in targets:
        module.weight_t = weight.detach().t().contiguous()
        if type(module) is nn.Linear:
            module.__class__ = TransposedGemvLinear
    return True


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (N a multiple of PANEL_COLUMNS = 16) in `few_rows_mm`'s layout: 1-D, N * K
    values of weight's dtype, panel p (columns 16 p .. 16 p + 15) one after another. A float32
    panel holds K rows of 16 values; a bf16 one K / 2 rows of 16 column pairs (w[n, 2 j],
    w[n, 2 j + 1]), the operand of AVX512-BF16's pair products. A copy: later changes to weight
    are not seen.

    Raises:
        ValueError: N not a multiple of 16, or a bf16 weight with an odd K.
    """
    n, k = weight.shape
    if n % PANEL_COLUMNS:
        raise ValueError(f"pack_panels: out_features must be a multiple of {PANEL_COLUMNS}, got {n}")
    if weight.dtype == torch.bfloat16:
        if k % 2:
            raise ValueError(f"pack_panels: a bf16 weight needs an even in_features, got {k}")
        panels = weight.detach().reshape(n // PANEL_COLUMNS, PANEL_COLUMNS, k // 2, 2).permute(0, 2, 1, 3)
    else:
        panels = weight.detach().t().reshape(k, n // PANEL_COLUMNS, PANEL_COLUMNS).permute(1, 0, 2)
    return panels.contiguous().reshape(-1)


def use_panel_weights(model: QwenForCausalLM, max_bytes: int = PANELS_MAX_BYTES, bf16: bool = False) -> bool:
    """Give every matmul of an `optimize_for_inference`d CPU float32 model a copy of its weight in
    column panels (`pack_panels`), which compiled graphs with the C++ operators run 1 to
    FEW_ROWS_MAX rows on (`wedlm_cpu::few_rows_mm`); in place. Returns whether it did. The panels
    have the dtype of the weights the matmuls read: float32, or bf16 for a `precast_for_autocast`ed
    model on a CPU with AVX512-BF16 (`bf16_panels_supported`; `bf16_panel_linear`). More rows
    keep their kernel: oneDNN where `use_onednn_linear` routed the matmul there, else BLAS
    (`panel_linear`). The panels replace the module's transposed copy (`use_transposed_gemv`'s
    `weight_t`, dropped): one-row matmuls run on them too, eager ones included. Memory: a copy of
    those weights instead of another (16 MB for the shipped model, 540 MB for SmolLM2-135M); models
    whose matmul weights exceed `max_bytes`, or with a weight whose out_features is not a multiple
    of 16, are left alone. Needs the engine's C++ operators (`use_native_ops`). Idempotent; weights
    changed afterwards need another call.

    With `bf16`, the panels of a float32 model (not precast) hold its weights rounded to bf16, and
    every matmul runs `bf16_weight_linear` on them (bf16 weights, float32 activations); False
    where the CPU has no AVX512-BF16 (`bf16_panels_supported`) or `bf16_panels_refusal` refuses
    the model. Each weight is rounded as it is packed (no bf16 copy of the whole model first)."""
    if _native_linear is None or model.dtype != torch.float32 or model.device.type != "cpu":
        return False
    targets = _matmuls(model)
    dtype = torch.bfloat16 if bf16 else targets[0][1].dtype if targets else None
    if (dtype not in (torch.float32, torch.bfloat16)
            or _panels_refusal(targets, dtype, torch.float32 if bf16 else dtype, max_bytes) is not None):
        return False
    if dtype == torch.bfloat16:
        if not bf16_panels_supported():
            return False
        global _bf16_few_rows_max
        _bf16_few_rows_max = BF16_AMX_FEW_ROWS_MAX if "amx_bf16" in cpu_flags() else FEW_ROWS_MAX
    # every panel copy in one block of memory on 2 MB pages where the kernel gives them: a step
    # streams all of them, and with 4 KB pages each 4 KB of weights costs a TLB miss
    block = huge_page_tensor(sum(w.numel() for _, w in targets), dtype)
    start = 0
    for module, weight in targets:
        panels = block[start:start + weight.numel()]
        panels.copy_(pack_panels(weight.detach().to(dtype)))
        module.weight_panels, module.weight_t = panels, None
        if type(module) is nn.Linear:  # a plain linear never reads weight_panels
            module.__class__ = TransposedGemvLinear
        start += weight.numel()
    bind_linears(model)  # rebinds every matmul to its new panels
    return True


def bind_linears(model: QwenForCausalLM) -> int:
    """Bind every matmul of `model` with float32 weights and column panels (`use_panel_weights`) to
    a key (`torch.ops.wedlm_cpu.bind_linear`): its weight, bias, panels and `_matmul`'s rule
    (oneDNN's prepacked key and thresholds where `use_onednn_linear` routed it, else
    `panel_linear`'s; `bf16_weight_linear`'s for bf16 panels).
    Compiled graphs traced from now on call `wedlm_cpu::bound_linear(x, module.linear_key,
    module.linear_n)` instead of `wedlm_cpu::linear` with those tensors: the same operator on the
    same arguments, but none of them a graph input: inductor's C++ wrapper makes, converts and
    frees a handle for every input on every call (docs/engine.md, "The engine's C++ operators").

    The model takes the smallest free slot of keys (`SLOT_KEYS` a model). A second call unbinds
    every earlier key of the model first (a matmul whose panels are gone reads no key) and binds
    the current panels with their rule. The keys are unbound, and the slot freed, when
    the model is garbage collected; until then the bound tensors stay alive with it.

    Returns:
        The number of matmuls bound (0 without the C++ operators or such panels).
    """
    if _native_linear is None:
        return 0
    found = _matmuls(model)
    keys = getattr(model, "linear_keys", None)  # the bound keys, a list the model's finalizer reads
    for module, _ in found:
        if getattr(module, "linear_key", 0):
            torch.ops.wedlm_cpu.unbind_linear(module.linear_key)
            module.linear_key = module.linear_n = 0
    if keys is not None:
        keys.clear()
    # float32 weights with panels: float32 ones (`panel_linear`'s or oneDNN's rule) or bf16 ones
    # (`bf16_weight_linear`'s: every row count on the panels)
    targets = [(m, w) for m, w in found if w.dtype == torch.float32 and m.weight_panels is not None
               and m.weight_panels.dtype in (torch.float32, torch.bfloat16)]
    if not targets:
        return 0
    slot = getattr(model, "linear_slot", None)
    if slot is None:
        with _slots_lock:
            slot = next(i for i in itertools.count() if i not in _slots)
            _slots.add(slot)
        keys = []
        model.linear_slot, model.linear_keys = slot, keys
        weakref.finalize(model, _unbind_slot, slot, keys).atexit = False
    for i, (module, weight) in enumerate(targets):
        key = slot * SLOT_KEYS + i + 1
        # the bias `_matmul` receives: the fused q/k/v one, none for gate/up, else the linear's
        bias = (module.qkv_bias if isinstance(module, FusedQKVAttention) else
                None if isinstance(module, FusedSwiGLU) else module.bias)
        rule = (_BF16_WEIGHT_RULE if module.weight_panels.dtype == torch.bfloat16 else
                _onednn_rule(module.packed_key) if module.onednn else _PANEL_RULE)
        torch.ops.wedlm_cpu.bind_linear(key, weight.detach(), None if bias is None else bias.detach(),
                                        module.weight_panels, *rule)
        module.linear_key, module.linear_n = key, weight.shape[0]
        keys.append(key)
    return len(targets)


def _unbind_slot(slot: int, keys: list[int]) -> None:
    for key in keys:
        torch.ops.wedlm_cpu.unbind_linear(key)
    with _slots_lock:
        _slots.discard(slot)


def bf16_panels_refusal(model: QwenForCausalLM, max_bytes: int = PANELS_MAX_BYTES) -> str | None:
    """Why `use_panel_weights(model, bf16=True)` cannot give this float32 model's matmuls bf16
    panels, as a phrase for an error message, or None where it can (the CPU aside:
    `bf16_panels_supported`). Works on a model before and after `optimize_for_inference` (its
    separate projections, or the fused ones: the fused out_features are sums of the parts')."""
    return _panels_refusal(_matmuls(model), torch.bfloat16, torch.float32, max_bytes)


def _panels_refusal(targets: list[tuple[nn.Module, torch.Tensor]], dtype: torch.dtype, source: torch.dtype,
                    max_bytes: int) -> str | None:
    """Why the weights of `targets` (`_matmuls`), all of dtype `source`, cannot be packed into
    `dtype` panels (out_features a multiple of 16, an even in_features for bf16's column pairs, at
    most `max_bytes` of panels), as a phrase for an error message; None where they can."""
    name = {torch.float32: "float32", torch.bfloat16: "bf16"}
    for _, w in targets:
        if w.dtype != source:
            return f"{name.get(source, source)} weights (a matmul weight is {w.dtype})"
        if w.shape[0] % PANEL_COLUMNS:
            return f"out_features that are multiples of {PANEL_COLUMNS} (a matmul weight is {tuple(w.shape)})"
        if dtype == torch.bfloat16 and w.shape[1] % 2:
            return f"even in_features (a matmul weight is {tuple(w.shape)})"
    total = dtype.itemsize * sum(w.numel() for _, w in targets)
    if total > max_bytes:
        return (f"at most {max_bytes / 2**30:g} GiB of matmul weights in {name.get(dtype, dtype)} "
                f"(this model has {total / 2**30:.2f})")
    return None


def bf16_panels_supported() -> bool:
    """`few_rows_mm` runs bf16 panels here: the loaded C++ operators multiply a bf16 panel, which
    they do on an x86-64 CPU with AVX512-BF16 (`vdpbf16ps`, whatever `WEDLM_CPU_BF16` says about the
    automatic choice of autocast) when built by a compiler that knows it. Tried once a process, on
    one row; False, not remembered, before the operators load."""
    global _bf16_kernel
    if _native_linear is None:
        return False
    if _bf16_kernel is None:
        panel = pack_panels(torch.ones(PANEL_COLUMNS, 2, dtype=torch.bfloat16))
        try:
            out = torch.ops.wedlm_cpu.few_rows_mm(torch.ones(1, 2, dtype=torch.bfloat16), panel, PANEL_COLUMNS, None)
            _bf16_kernel = bool((out == 2).all())
        except RuntimeError:  # a CPU without AVX512-BF16, or a build without the kernel
            _bf16_kernel = False
    return _bf16_kernel


def huge_page_tensor(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zero-filled 1-D CPU tensor of `numel` elements whose memory the kernel may back with 2 MB
    pages (transparent huge pages), starting on a 2 MB boundary (`zeroed_cpu_tensor`).

    The matmuls of a decode step read every weight once, more than the TLB covers with 4 KB pages:
    the shipped model's 16 MB of column panels (`use_panel_weights`) ran its 16-row matmuls at
    1.06x the rate on 2 MB pages (`few_rows_mm` over all of them in turn, one Zen 4 thread,
    92 against 87 GFLOP/s; 87 against 82 with the caches flushed first). Where the system has no
    such pages (not Linux, a kernel without them, or transparent huge pages set to `never`) it is
    ordinary memory.
    """
    return zeroed_cpu_tensor((numel,), dtype, huge_pages=True)


def _matmuls(model: QwenForCausalLM) -> list[tuple[nn.Module, torch.Tensor]]:
    """(module, the weight its matmul reads) for every matmul of an `optimize_for_inference`d model:
    the fused q/k/v and gate/up weights, and every other linear (o_proj, down_proj, lm_head) that
    is not a part of a fused one (its `precast_for_autocast` copy where it has one)."""
    fused_parts = {id(lin) for module in model.modules() for lin in _fused_projections(module)}
    found = []
    for module in model.modules():
        if isinstance(module, FusedQKVAttention):
            found.append((module, module.qkv_weight))
        elif isinstance(module, FusedSwiGLU):
            found.append((module, module.gate_up_weight))
        elif type(module) in (nn.Linear, OneDNNLinear, TransposedGemvLinear) and id(module) not in fused_parts:
            found.append((module, module.weight))
        elif type(module) is PrecastLinear:
            found.append((module, module.weight16))
    return found


def plain_weights(model: QwenForCausalLM) -> list[torch.Tensor]:
    """The matmul weights of an `optimize_for_inference`d model that are plain tensors, not
    parameters: fused q/k/v (and bias) and gate/up weights, `precast_for_autocast` copies,
    `use_transposed_gemv` copies and `use_panel_weights` panels, with the block of memory the
    panels are views into."""
    found = []
    for module in model.modules():
        for name in ("qkv_weight", "qkv_bias", "gate_up_weight", "weight16", "bias16", "weight_t", "weight_panels"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter):
                found.append(t)
                # the panels are views into one block (`use_panel_weights`): dynamo reads the block's
                # size too, a symbolic size guarded on every call unless the block is marked static
                if t._base is not None and all(t._base is not f for f in found):
                    found.append(t._base)
    return found


def _fused_projections(module: nn.Module) -> tuple[nn.Linear, ...]:
    """The q/k/v or gate/up projections whose matmul runs through `module`'s fused weight."""
    if isinstance(module, FusedQKVAttention):
        return module.q_proj, module.k_proj, module.v_proj
    if isinstance(module, FusedSwiGLU):
        return module.gate_proj, module.up_proj
    return ()


def _fuse_params(params: list[torch.Tensor]) -> torch.Tensor:
    """A plain tensor (not a Parameter: the state dict and parameter count stay unchanged)."""
    return torch.cat([p.detach() for p in params], dim=0)


def _row_views(fused: torch.Tensor, parts: list[torch.Tensor]) -> list[nn.Parameter]:
    views, start = [], 0
    for p in parts:
        views.append(nn.Parameter(fused[start:start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return views


def optimize_for_inference(model: QwenForCausalLM) -> QwenForCausalLM:
    """Swap in the fused modules (in place) and return the model; RoPE from tables where they
    take at most ROPE_TABLE_MAX_BYTES (`RotaryEmbedding.tabulate`). Idempotent."""
    cfg = model.config
    rotary = model.model.rotary
    if rotary.cos_table is None and 8 * cfg.max_position_embeddings * cfg.head_dim <= ROPE_TABLE_MAX_BYTES:
        rotary.tabulate(cfg.max_position_embeddings)
    fp32 = model.dtype == torch.float32
    for module in model.modules():
        if isinstance(module, Attention) and not isinstance(module, FusedQKVAttention):
            module.__class__ = FusedQKVAttention
            module.fuse()
        elif isinstance(module, SwiGLU) and not isinstance(module, FusedSwiGLU) and module.gate_proj.bias is None:
            # an MLP with biases (Llama's mlp_bias) keeps its three plain projections
            module.__class__ = FusedSwiGLU
            module.fuse()
        elif fp32 and type(module) is RMSNorm:
            module.__class__ = FusedRMSNorm
    return model
