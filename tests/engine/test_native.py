"""The C++ operators of compiled CPU graphs (`native.py`, `csrc/`): built once and cached; the
matmul gives the Python operator's results exactly and holds weak keys; the few-rows matmul gives
oneDNN's values bit for bit where K fits one oneDNN block; the one-row matmul is the
matrix-vector product and the one-query attention SDPA's; a failed build is harmless."""


import gc
import logging
import weakref

import pytest
import torch
import torch.nn.functional as F

from wedlm.engine import native
from wedlm.engine.fast_model import (
    FEW_ROWS_MAX,
    ONEDNN_MIN_ROWS,
    PACKED_MIN_MACS,
    bf16_panels_supported,
    pack_panels,
    pack_weight,
    use_native_ops,
)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")


@pytest.fixture(scope="module")
def cpp_op():
    assert use_native_ops(), "the C++ operator did not build (is there a C++ compiler and ninja?)"
    return torch.ops.wedlm_cpu.linear.default


def _rule(cpp_op, x, w, b, key, panels=None):
    """The C++ matmul with the rule's constants from `fast_model`."""
    return cpp_op(x, w, b, panels, key, PACKED_MIN_MACS, ONEDNN_MIN_ROWS, FEW_ROWS_MAX)


def _both(cpp_op, x, w, b, key):
    with torch.inference_mode():
        return _rule(cpp_op, x, w, b, key), torch.ops.wedlm.onednn_linear(x, w, b, key)


def _calls_onednn(fn) -> bool:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return "mkldnn::_linear_pointwise" in {e.name for e in prof.events()}


# a [160, 96] weight: 15,360 multiply-adds a row, PACKED_MIN_MACS from 35 rows
PACKED_ROWS = -(-PACKED_MIN_MACS // (160 * 96))


@pytest.mark.parametrize("rows", [1, 2, ONEDNN_MIN_ROWS, PACKED_ROWS - 1, PACKED_ROWS, 80])
def test_the_cpp_operator_gives_the_python_operators_values(cpp_op, rows):
    """Same rule, same kernel, so bit for bit the same output, packed or not, 2-D or 3-D."""
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(160, 96, generator=gen), torch.randn(160, generator=gen)
    packed, key = pack_weight(w)
    for x in (torch.randn(rows, 96, generator=gen), torch.randn(rows, 2, 96, generator=gen)):
        for k, bias in ((key, b), (key, None), (0, b)):
            got, want = _both(cpp_op, x, w, bias, k)
            assert got.shape == (*x.shape[:-1], 160) and torch.equal(got, want)
        assert (got - F.linear(x, w, b)).abs().max().item() <= 1e-5 * got.abs().max().item()
    flat = torch.randn(rows, 96, generator=gen)
    assert _calls_onednn(lambda: _rule(cpp_op, flat, w, b, key)) is (rows >= PACKED_ROWS)
    assert _calls_onednn(lambda: _rule(cpp_op, flat, w, b, 0)) is (rows >= ONEDNN_MIN_ROWS)
    del packed


# the shipped model's matmuls ([out, in]: q/k/v, o_proj, gate/up, down_proj, lm_head) and widths
# that are not multiples of the one-row tile's 64 columns
SHIPPED_SHAPES = [(384, 192), (192, 192), (1024, 192), (192, 512), (4096, 192), (80, 96), (208, 33)]


@pytest.mark.parametrize("rows", [2, 5, 8, 13, 16, 17, 38])
@pytest.mark.parametrize("n,k", SHIPPED_SHAPES)
def test_few_rows_mm_gives_onednns_values(cpp_op, rows, n, k):
    """One FMA chain over k in order per output, oneDNN's order for K <= 512: bit for bit the
    prepacked oneDNN matmul's result, with and without a bias, for row counts that split into
    row blocks (16 rows at most with AVX-512, 6 otherwise) evenly and unevenly."""
    gen = torch.Generator().manual_seed(rows * 7 + n + k)
    w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    packed, key = pack_weight(w)
    panels = pack_panels(w)
    with torch.inference_mode():
        for bias in (None, b):
            got = torch.ops.wedlm_cpu.few_rows_mm(x, panels, n, bias)
            want = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
            assert got.shape == (rows, n) and torch.equal(got, want)


@pytest.mark.parametrize("k", [576, 1536])
def test_few_rows_mm_is_the_matmul_for_long_rows(cpp_op, k):
    """Past one oneDNN block of K the two sum in different orders: within float32 summation
    error of a float64 reference."""
    gen = torch.Generator().manual_seed(k)
    x, w = torch.randn(9, k, generator=gen), torch.randn(96, k, generator=gen)
    got = torch.ops.wedlm_cpu.few_rows_mm(x, pack_panels(w), 96, None)
    want = x.double() @ w.double().t()
    bound = k * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().t())
    assert ((got.double() - want).abs() <= bound).all()


def test_the_matmul_takes_few_rows_on_the_panels(cpp_op):
    """With a panel copy, 1 to FEW_ROWS_MAX rows run `few_rows_mm` (no oneDNN call, its values),
    more rows the oneDNN rule; 3-D inputs keep their shape."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(1024, 192, generator=gen)
    packed, key = pack_weight(w)
    wt = pack_panels(w)
    for rows in (1, 2, 16, FEW_ROWS_MAX, FEW_ROWS_MAX + 1):
        x = torch.randn(rows, 192, generator=gen)
        with torch.inference_mode():
            got = _rule(cpp_op, x, w, None, key, wt)
            few = rows <= FEW_ROWS_MAX
            want = torch.ops.wedlm_cpu.few_rows_mm(x, wt, 1024, None) if few else _rule(cpp_op, x, w, None, key)
            assert torch.equal(got, want)
            assert _calls_onednn(lambda x=x: _rule(cpp_op, x, w, None, key, wt)) is (rows > FEW_ROWS_MAX)
    x3 = torch.randn(4, 2, 192, generator=gen)
    with torch.inference_mode():
        assert torch.equal(_rule(cpp_op, x3, w, None, key, wt), _rule(cpp_op, x3.view(8, 192), w, None, key, wt).view(4, 2, 1024))
    del packed


def test_few_rows_mm_refuses_what_it_does_not_compute(cpp_op):
    mm = torch.ops.wedlm_cpu.few_rows_mm
    with pytest.raises(RuntimeError, match="N must be a positive multiple of 16, got 40"):
        mm(torch.randn(3, 8), torch.randn(320), 40, None)
    with pytest.raises(RuntimeError, match="panels must be a contiguous packing of N x K = 128 values, got 144"):
        mm(torch.randn(3, 8), torch.randn(144), 16, None)
    with pytest.raises(RuntimeError, match=r"x must be \[M, K\]"):
        mm(torch.randn(3, 1, 8), torch.randn(128), 16, None)
    with pytest.raises(RuntimeError, match=r"bias must be float32 \[N = 16\]"):
        mm(torch.randn(3, 8), torch.randn(128), 16, torch.randn(8))
    with pytest.raises(RuntimeError, match="panels must be float32 or bfloat16, got Double"):
        mm(torch.randn(3, 8).double(), torch.randn(128).double(), 16, None)
    with pytest.raises(RuntimeError, match=r"x \(BFloat16\) must have the panels' dtype \(Float\), or be float32 "
                                           r"with bf16 panels"):
        mm(torch.randn(3, 8).bfloat16(), torch.randn(128), 16, None)
    with pytest.raises(RuntimeError, match=r"bias must be bfloat16 \[N = 16\]"):
        mm(torch.randn(3, 8).bfloat16(), torch.randn(128).bfloat16(), 16, torch.randn(16))
    with pytest.raises(RuntimeError, match="bf16 panels need an even K, got 7"):
        mm(torch.randn(3, 7).bfloat16(), torch.randn(112).bfloat16(), 16, None)
    with pytest.raises(ValueError, match="out_features must be a multiple of 16, got 40"):
        pack_panels(torch.randn(40, 8))
    with pytest.raises(ValueError, match="a bf16 weight needs an even in_features, got 7"):
        pack_panels(torch.randn(16, 7).bfloat16())


def test_pack_panels_lays_out_column_panels():
    """Panel p is columns 16 p .. 16 p + 15 of W^T, K rows of 16 values, one panel after another."""
    w = torch.arange(80 * 3, dtype=torch.float32).view(80, 3)  # w[n, k] = 3n + k
    got = pack_panels(w)
    assert got.shape == (240,) and got.is_contiguous()
    for p in range(5):
        assert torch.equal(got[48 * p:48 * (p + 1)].view(3, 16), w[16 * p:16 * (p + 1)].t())
    assert got[:4].tolist() == [0.0, 3.0, 6.0, 9.0] and got[16:18].tolist() == [1.0, 4.0]


def test_pack_panels_lays_out_bf16_column_pairs():
    """A bf16 panel is K / 2 rows of 16 column pairs: (w[n, 2 j], w[n, 2 j + 1]) for n in the panel."""
    w = torch.arange(32 * 4, dtype=torch.float32).view(32, 4).bfloat16()  # w[n, k] = 4n + k
    got = pack_panels(w)
    assert got.dtype == torch.bfloat16 and got.shape == (128,)
    assert got[:6].tolist() == [0, 1, 4, 5, 8, 9] and got[32:34].tolist() == [2, 3]
    assert got[64:66].tolist() == [64, 65]  # panel 1 starts at column 16
    for p in range(2):
        for j in range(2):
            pairs = got[64 * p + 32 * j:64 * p + 32 * (j + 1)].view(16, 2)
            assert torch.equal(pairs, w[16 * p:16 * (p + 1), 2 * j:2 * j + 2])


@pytest.fixture
def bf16_op(cpp_op):
    """`cpp_op` where it multiplies bf16 panels (a CPU with AVX512-BF16), else the test skips."""
    if not bf16_panels_supported():
        pytest.skip("needs a CPU with AVX512-BF16")
    return cpp_op


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 16, 17, 40])
@pytest.mark.parametrize("n,k", [(64, 96), (960, 576), (576, 1536), (48, 2), (16, 4)])
def test_few_rows_mm_on_bf16_panels_is_autocasts_linear(bf16_op, rows, n, k):
    """bf16 x and panels: float32 sums of bf16 products rounded to bf16 once, as F.linear under
    bf16 autocast; the two sum in other orders, so an output may be a bf16 unit from torch's (more
    only within float32 summation error, where the sum cancels), and is as close to the float64
    product of the same bf16 values."""
    gen = torch.Generator().manual_seed(rows * 11 + n + k)
    w, b = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen).bfloat16()
    x = torch.randn(rows, k, generator=gen)
    for bias in (None, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = F.linear(x, w, bias)
        got = torch.ops.wedlm_cpu.few_rows_mm(x.bfloat16(), pack_panels(w), n, bias)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        exact = x.bfloat16().double() @ w.double().t() + (0 if bias is None else bias.double())
        ulp = torch.finfo(torch.bfloat16).eps * torch.maximum(got.double().abs(), want.double().abs())
        sums = k * torch.finfo(torch.float32).eps * (x.bfloat16().double().abs() @ w.double().abs().t())
        apart = (got.double() - want.double()).abs()
        assert (apart <= ulp + sums).all() and (apart == 0).float().mean() >= 0.99
        assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max() + ulp.max()


@pytest.mark.parametrize("rows", [1, 3, 8, 16, 40])
@pytest.mark.parametrize("n,k", [(64, 96), (960, 576), (48, 2)])
def test_few_rows_mm_on_bf16_panels_keeps_float32_rows_float32(bf16_op, rows, n, k):
    """float32 x with bf16 panels (bf16 weights, float32 activations): x rounded to bf16 as torch
    casts it, the float32 sums returned unrounded, so that rounding them gives exactly the bf16
    rows' outputs; within float32 summation error of the float64 product of the same bf16 values."""
    gen = torch.Generator().manual_seed(rows * 7 + n + k)
    w, b = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    panels = pack_panels(w)
    for bias in (None, b):
        got = torch.ops.wedlm_cpu.few_rows_mm(x, panels, n, bias)
        assert got.dtype == torch.float32 and got.shape == (rows, n)
        exact = x.bfloat16().double() @ w.double().t() + (0 if bias is None else bias.double())
        sums = k * torch.finfo(torch.float32).eps * (x.bfloat16().double().abs() @ w.double().abs().t())
        assert ((got.double() - exact).abs() <= sums + 1e-6 * exact.abs()).all()
    rounded = torch.ops.wedlm_cpu.few_rows_mm(x.bfloat16(), panels, n, None)
    assert torch.equal(torch.ops.wedlm_cpu.few_rows_mm(x, panels, n, None).bfloat16(), rounded)


@pytest.mark.parametrize("rows", [1, 7, 17])
@pytest.mark.parametrize("k", [2, 70])
def test_float32_rows_are_rounded_as_torch_rounds_them(bf16_op, rows, k):
    """float32 rows on bf16 panels are rounded to bf16 exactly as torch rounds them: through
    identity panels each output is one rounded input, for ties (to even), values that round up a
    binade and zeros (subnormals read as zero by the product); with infinities, NaN and a value
    that rounds to inf, the outputs are those of rows rounded by torch first. Row counts that
    split into blocks."""
    gen = torch.Generator().manual_seed(rows * 31 + k)
    finite = torch.tensor([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20, -(2.0 - 2 ** -9),
                           1e-39, -1e-40, 1e-45, 0.0, -0.0])
    special = torch.tensor([3.3961e38, float("inf"), -float("inf"), float("nan")])

    def with_values(values: torch.Tensor) -> torch.Tensor:
        x = torch.randn(rows, k, generator=gen)
        picks = torch.randperm(x.numel(), generator=gen)[:min(x.numel(), 3 * values.numel())]
        x.view(-1)[picks] = values.repeat(3)[:picks.numel()]
        return x

    x = with_values(finite)
    n = -(-k // 16) * 16
    got = torch.ops.wedlm_cpu.few_rows_mm(x, pack_panels(torch.eye(n, k).bfloat16()), n, None)
    want = x.bfloat16().float()
    want[want.abs() < torch.finfo(torch.float32).tiny] = 0.0  # `vdpbf16ps` reads subnormals as zero
    assert got.dtype == torch.float32 and torch.equal(got[:, :k], want)
    x = with_values(torch.cat([finite, special]))
    panels = pack_panels(torch.randn(48, k, generator=gen).bfloat16())
    got = torch.ops.wedlm_cpu.few_rows_mm(x, panels, 48, None)
    want = torch.ops.wedlm_cpu.few_rows_mm(x.bfloat16(), panels, 48, None)
    torch.testing.assert_close(got.bfloat16(), want, rtol=0, atol=0, equal_nan=True)


def test_bf16_weights_run_every_row_count_on_the_panels(bf16_op):
    """`bf16_weight_linear`: every row count through `few_rows_mm` on the bf16 panels (the same
    bf16 weights for a prefill as for a decode step), float32 in and out, bias included."""
    from wedlm.engine.fast_model import bf16_weight_linear

    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(64, 32, generator=gen), torch.randn(64, generator=gen)
    panels = pack_panels(w.bfloat16())
    for rows in (1, 12, FEW_ROWS_MAX + 3):
        x = torch.randn(2, rows, 32, generator=gen)
        got = bf16_weight_linear(x, w, b, panels)
        want = torch.ops.wedlm_cpu.few_rows_mm(x.reshape(-1, 32), panels, 64, b).view(2, rows, 64)
        assert got.dtype == torch.float32 and torch.equal(got, want)


def test_the_matmul_takes_bf16_rows_on_bf16_panels(bf16_op):
    """bf16 inputs with bf16 panels: 1 to FEW_ROWS_MAX rows by `few_rows_mm`, more by at::linear
    on the bf16 weight (what autocast's F.linear computes); bf16 out either way."""
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(256, 128, generator=gen).bfloat16()
    panels = pack_panels(w)
    for rows in (1, 16, FEW_ROWS_MAX, FEW_ROWS_MAX + 1):
        x = torch.randn(rows, 128, generator=gen).bfloat16()
        got = _rule(bf16_op, x, w, None, 0, panels)
        want = (torch.ops.wedlm_cpu.few_rows_mm(x, panels, 256, None) if rows <= FEW_ROWS_MAX
                else F.linear(x, w))
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_the_instruction_set_follows_the_cpu_flags():
    """AVX-512 needs AVX-512F, AVX2 and FMA; AVX2 needs AVX2 and FMA; anything else, and any
    machine that is not x86-64, builds for the compiler's baseline."""
    from wedlm.engine import native

    assert native.instruction_set({"avx512f", "avx2", "fma"}, "x86_64") == "avx512"
    assert native.instruction_set({"avx512f", "avx2"}, "x86_64") == "base"
    assert native.instruction_set({"avx2", "fma", "sse4_2"}, "AMD64") == "avx2"
    assert native.instruction_set({"avx", "fma"}, "x86_64") == "base"
    assert native.instruction_set({"avx512f", "avx2", "fma"}, "aarch64") == "base"
    assert native.ISA_FLAGS["avx2"] == ["-mavx2", "-mfma"]


def test_huge_page_tensors_start_on_a_huge_page(monkeypatch):
    """`huge_page_tensor`: numel elements of the dtype, writable, on a 2 MB boundary where the
    system can be asked for huge pages; small or without `MADV_HUGEPAGE`, an ordinary tensor."""
    import mmap

    from wedlm.engine.fast_model import huge_page_tensor
    from wedlm.model.memory import HUGE_PAGE

    for numel, dtype in [(HUGE_PAGE // 4 + 5, torch.float32), (3 * HUGE_PAGE // 2, torch.bfloat16)]:
        t = huge_page_tensor(numel, dtype)
        assert t.shape == (numel,) and t.dtype == dtype and t.is_contiguous()
        t.fill_(2)
        assert t.sum(dtype=torch.float64).item() == 2 * numel
        if hasattr(mmap, "MADV_HUGEPAGE"):
            assert t.data_ptr() % HUGE_PAGE == 0
    assert huge_page_tensor(100).shape == (100,)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # a kernel without huge pages refuses the advice: ordinary pages
        monkeypatch.setattr(mmap, "MADV_HUGEPAGE", -1)
        t = huge_page_tensor(HUGE_PAGE)
        assert t.shape == (HUGE_PAGE,) and t.fill_(1).sum().item() == HUGE_PAGE
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    assert huge_page_tensor(HUGE_PAGE).shape == (HUGE_PAGE,)


def test_panel_weights_share_one_block_of_memory(tiny_path):
    """`use_panel_weights` gives every matmul its `pack_panels` copy, all of them views into one
    `huge_page_tensor` block, one after another."""
    from wedlm.engine.fast_model import _matmuls, optimize_for_inference, use_onednn_linear, use_panel_weights
    from wedlm.model import load_model

    model = optimize_for_inference(load_model(str(tiny_path)))
    use_onednn_linear(model)
    assert use_native_ops() and use_panel_weights(model)
    matmuls = _matmuls(model)
    first = matmuls[0][0].weight_panels
    offset = 0
    for module, weight in matmuls:
        assert torch.equal(module.weight_panels, pack_panels(weight))
        assert module.weight_panels.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        assert module.weight_panels.data_ptr() == first.data_ptr() + 4 * offset
        offset += weight.numel()


@pytest.mark.parametrize("rows", [1, 5, FEW_ROWS_MAX, FEW_ROWS_MAX + 1, 300])
def test_a_bound_matmul_is_the_matmul_with_its_arguments(cpp_op, rows):
    """`bound_linear(x, key, n)` runs `linear` on what `bind_linear` bound to the key: bit for bit
    its output on every path (panels, prepacked oneDNN, BLAS), with and without bias."""
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(160, 96, generator=gen), torch.randn(160, generator=gen)
    packed, packed_key = pack_weight(w)
    panels = pack_panels(w)
    x = torch.randn(rows, 96, generator=gen)
    for key, bias in ((7001, b), (7002, None)):
        torch.ops.wedlm_cpu.bind_linear(key, w, bias, panels, packed_key, PACKED_MIN_MACS, ONEDNN_MIN_ROWS,
                                        FEW_ROWS_MAX)
        want = _rule(cpp_op, x, w, bias, packed_key, panels)
        assert torch.equal(torch.ops.wedlm_cpu.bound_linear(x, key, 160), want)
        assert torch.equal(torch.ops.wedlm_cpu.bound_linear(x.view(1, rows, 96), key, 160), want.view(1, rows, 160))
        torch.ops.wedlm_cpu.unbind_linear(key)
    del packed


def test_a_bound_matmul_refuses_other_keys_and_shapes(cpp_op):
    """An unbound key, or a call whose sizes are not the bound weight's (a graph cached by another
    process names keys and sizes only), is an error naming the key, not a wrong matmul."""
    w = torch.randn(32, 16)
    torch.ops.wedlm_cpu.bind_linear(7003, w, None, pack_panels(w), 0, PACKED_MIN_MACS, ONEDNN_MIN_ROWS, FEW_ROWS_MAX)
    with pytest.raises(RuntimeError, match=r"key 7003 holds a \[32, 16\] weight, the call asks for \[48, 16\]"):
        torch.ops.wedlm_cpu.bound_linear(torch.randn(4, 16), 7003, 48)
    with pytest.raises(RuntimeError, match=r"\[32, 16\] weight, the call asks for \[32, 8\]"):
        torch.ops.wedlm_cpu.bound_linear(torch.randn(4, 8), 7003, 32)
    torch.ops.wedlm_cpu.unbind_linear(7003)
    with pytest.raises(RuntimeError, match="no matmul is bound to key 7003"):
        torch.ops.wedlm_cpu.bound_linear(torch.randn(4, 16), 7003, 32)


def test_a_models_matmuls_are_bound_until_it_is_collected(tiny_path):
    """`use_panel_weights` binds every float32 matmul to a key of the model's slot, with
    `_matmul`'s rule (oneDNN's for a `use_onednn_linear`d model); a collected model frees its
    keys and slot, which the next model takes again (so its graphs name the same keys)."""
    from wedlm.engine.fast_model import (
        SLOT_KEYS,
        FusedSwiGLU,
        _matmuls,
        optimize_for_inference,
        use_onednn_linear,
        use_panel_weights,
    )
    from wedlm.model import load_model

    def prepared(onednn: bool):
        model = optimize_for_inference(load_model(str(tiny_path)))
        if onednn:
            use_onednn_linear(model)
        assert use_native_ops() and use_panel_weights(model)
        return model

    first = prepared(onednn=True)
    matmuls = [module for module, _ in _matmuls(first)]
    slot = first.linear_slot
    assert [m.linear_key for m in matmuls] == [slot * SLOT_KEYS + i + 1 for i in range(len(matmuls))]
    for module, weight in _matmuls(first):
        bias = None if isinstance(module, FusedSwiGLU) else getattr(module, "qkv_bias", getattr(module, "bias", None))
        x = torch.randn(16, weight.shape[1])
        want = _rule(torch.ops.wedlm_cpu.linear.default, x, weight, bias, module.packed_key, module.weight_panels)
        assert module.linear_n == weight.shape[0] and module.packed_key
        assert torch.equal(torch.ops.wedlm_cpu.bound_linear(x, module.linear_key, module.linear_n), want)
    second = prepared(onednn=False)
    assert second.linear_slot != slot
    key = matmuls[0].linear_key
    del first, matmuls, module
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no matmul is bound to key {key}"):
        torch.ops.wedlm_cpu.bound_linear(torch.randn(2, 8), key, 16)
    third = prepared(onednn=False)
    assert third.linear_slot == slot
    del second, third
    gc.collect()


def test_rebinding_drops_keys_of_matmuls_without_panels(tiny_path):
    """A second `bind_linears` unbinds every earlier key: a matmul whose panels are gone reads no
    key, so a compiled graph cannot run stale weights; `use_panel_weights(..., bf16=True)` after
    float32 panels binds every matmul to its bf16 panels with `bf16_weight_linear`'s rule (the
    same values as that function)."""
    from wedlm.engine.fast_model import (
        FusedSwiGLU,
        _matmuls,
        bf16_panels_supported,
        bf16_weight_linear,
        bind_linears,
        optimize_for_inference,
        use_panel_weights,
    )
    from wedlm.model import load_model

    model = optimize_for_inference(load_model(str(tiny_path)))
    assert use_native_ops() and use_panel_weights(model)
    modules = [m for m, _ in _matmuls(model)]
    old = [m.linear_key for m in modules]
    modules[0].weight_panels = None
    assert bind_linears(model) == len(modules) - 1
    assert modules[0].linear_key == modules[0].linear_n == 0 and all(m.linear_key for m in modules[1:])
    assert model.linear_keys == [m.linear_key for m in modules[1:]]
    with pytest.raises(RuntimeError, match=f"no matmul is bound to key {old[-1]}"):
        torch.ops.wedlm_cpu.bound_linear(torch.randn(2, 8), old[-1], 16)
    if bf16_panels_supported():
        assert use_panel_weights(model, bf16=True)
        assert model.linear_keys == [m.linear_key for m in modules] and all(model.linear_keys)
        for module, weight in _matmuls(model):
            bias = None if isinstance(module, FusedSwiGLU) else getattr(module, "qkv_bias", getattr(module, "bias", None))
            x = torch.randn(5, weight.shape[1])
            want = bf16_weight_linear(x, weight, bias, module.weight_panels)
            assert torch.equal(torch.ops.wedlm_cpu.bound_linear(x, module.linear_key, module.linear_n), want)


def test_a_key_does_not_keep_its_packed_weight_alive(cpp_op):
    """The C++ table holds weak references, like `fast_model._PACKED`: once the owner drops the
    packed tensor it is freed, and the key falls back to the unpacked rule."""
    w = torch.randn(4096, 192)
    x = torch.randn(3, 192)  # 3 x 786,432 multiply-adds: oneDNN while the packed weight lives
    packed, key = pack_weight(w)
    freed = []
    watch = weakref.ref(packed, lambda _: freed.append(True))
    assert _calls_onednn(lambda: _rule(cpp_op, x, w, None, key))
    del packed
    gc.collect()
    assert freed == [True] and watch() is None
    assert not _calls_onednn(lambda: _rule(cpp_op, x, w, None, key))
    assert torch.equal(_rule(cpp_op, x, w, None, key), F.linear(x, w))


def test_weights_packed_before_the_load_are_known(cpp_op):
    """`use_native_ops` hands over the keys of weights packed before it ran; `pack_weight`
    those after. Both reach oneDNN on the packed copy at 2 rows (below the unpacked rule)."""
    w = torch.randn(4096, 192)
    x = torch.randn(2, 192)
    packed, key = pack_weight(w)
    assert use_native_ops()  # idempotent
    assert _calls_onednn(lambda: _rule(cpp_op, x, w, None, key))
    del packed


def test_the_library_is_cached_on_disk(cpp_op):
    """Built once per torch version, source and instruction set: the library sits in
    `native.build_dir()` under a name holding both."""
    libs = list(native.build_dir().glob("wedlm_cpu_*/wedlm_cpu_*.so"))
    assert libs, native.build_dir()
    name = f"wedlm_cpu_{native.instruction_set()}_{native.sources_digest()[:12]}"
    assert any(lib.parent.name == name for lib in libs)
    # every source file counts: an edit to any of them names a new library
    assert "one_row_mm.cpp" in native.SOURCE.read_text() and (native.CSRC / "simd.h").is_file()


def test_the_operators_split_work_across_threads(cpp_op, monkeypatch):
    """On Linux the library is built with OpenMP, on which `at::parallel_for` runs (without it the
    call is a serial loop whatever torch's thread count): the built library calls into GNU
    OpenMP's runtime, and the flags are part of its name."""
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("OpenMP flags are given on Linux only")
    assert native.OPENMP_FLAGS == ["-fopenmp"]  # as it was before the build (torch's builder appends to lists)
    name = f"wedlm_cpu_{native.instruction_set()}_{native.sources_digest()[:12]}"
    assert b"GOMP_parallel" in (native.build_dir() / name / f"{name}.so").read_bytes()
    monkeypatch.setattr(native, "OPENMP_FLAGS", [])
    assert native.sources_digest()[:12] != name[-12:]


def test_a_failed_build_keeps_the_python_operator(tmp_path, monkeypatch, caplog):
    """A source that does not compile: `load` returns False, logs why, raises nothing; the build
    leaves the flags (and so the library's name) as they were."""
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setattr(native, "CSRC", tmp_path)
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("WEDLM_CACHE", str(tmp_path / "cache"))
    flags, digest = list(native.OPENMP_FLAGS), native.sources_digest()
    with caplog.at_level(logging.WARNING, logger="wedlm.engine.native"):
        assert native.load() is False
        assert native.load() is False  # decided once
    assert [r.message.startswith("C++ operators not built") for r in caplog.records] == [True]
    assert native.OPENMP_FLAGS == flags and native.sources_digest() == digest


@pytest.mark.parametrize("k,n", [(192, 384), (192, 4096), (512, 192), (7, 5), (13, 33), (1, 16)])
def test_one_row_mm_is_the_matrix_vector_product(cpp_op, k, n):
    """x[1, K] @ weight_t[K, N] within float32 summation error of a float64 reference, for
    widths that are and are not multiples of the 16-float vectors and the 4-row blocks."""
    gen = torch.Generator().manual_seed(k * 1000 + n)
    x, wt = torch.randn(1, k, generator=gen), torch.randn(k, n, generator=gen)
    got = torch.ops.wedlm_cpu.one_row_mm(x, wt)
    want = (x.double() @ wt.double())
    bound = k * torch.finfo(torch.float32).eps * (x.double().abs() @ wt.double().abs())
    assert got.shape == (1, n) and got.dtype == torch.float32
    assert ((got.double() - want).abs() <= bound).all()
    # a [1, 1, K] input (one row with leading dimensions) gives the same row
    assert torch.equal(torch.ops.wedlm_cpu.one_row_mm(x.view(1, 1, k), wt), got)


def test_one_row_mm_refuses_what_it_does_not_compute(cpp_op):
    with pytest.raises(RuntimeError, match="x must hold one row of K = 8 values, got 16"):
        torch.ops.wedlm_cpu.one_row_mm(torch.randn(2, 8), torch.randn(8, 4))
    with pytest.raises(RuntimeError, match="weight_t must be a contiguous"):
        torch.ops.wedlm_cpu.one_row_mm(torch.randn(1, 8), torch.randn(4, 8).t())
    with pytest.raises(RuntimeError, match="must be float32"):
        torch.ops.wedlm_cpu.one_row_mm(torch.randn(1, 8).double(), torch.randn(8, 4).double())


@pytest.mark.parametrize("batch,q_heads,kv_heads,keys,dim", [
    (1, 4, 2, 41, 48), (1, 4, 2, 500, 48), (2, 4, 2, 33, 48), (1, 8, 8, 17, 20), (1, 4, 2, 1, 48), (1, 4, 1, 7, 64),
])
def test_one_query_attention_is_sdpa(cpp_op, batch, q_heads, kv_heads, keys, dim):
    """One query per head over every key, grouped-query heads, the cache's strided key views:
    SDPA's result within float32 rounding."""
    gen = torch.Generator().manual_seed(keys * 10 + dim)
    q = torch.randn(batch, 1, q_heads, dim, generator=gen).transpose(1, 2)
    k = torch.randn(batch, keys, kv_heads, dim, generator=gen).transpose(1, 2)
    v = torch.randn(batch, keys, kv_heads, dim, generator=gen).transpose(1, 2)
    want = F.scaled_dot_product_attention(q, k, v, scale=0.15, enable_gqa=True)
    got = torch.ops.wedlm_cpu.one_query_attention(q, k, v, 0.15)
    assert got.shape == want.shape and got.is_contiguous()
    assert (got - want).abs().max().item() <= 2e-6


def test_one_query_attention_refuses_what_it_does_not_compute(cpp_op):
    q, k = torch.randn(1, 4, 2, 48), torch.randn(1, 2, 9, 48)
    with pytest.raises(RuntimeError, match=r"q must be \[B, Hq, 1, D\]"):
        torch.ops.wedlm_cpu.one_query_attention(q, k, k, 0.1)
    with pytest.raises(RuntimeError, match="Hq a multiple of Hkv"):
        torch.ops.wedlm_cpu.one_query_attention(torch.randn(1, 3, 1, 48), k, k, 0.1)


def _causal_mask(batch, queries, keys, context):
    """bool [batch, 1, queries, keys]: query i of sequence b sees keys 0..context[b] + i."""
    ctx = torch.tensor(context)[:, None, None]
    return (torch.arange(keys)[None, None, :] <= ctx + torch.arange(queries)[None, :, None])[:, None]


@pytest.mark.parametrize("batch,q_heads,kv_heads,queries,keys,dim", [
    (1, 4, 2, 16, 500, 48), (1, 4, 2, 1, 41, 48), (2, 4, 2, 7, 33, 48), (1, 8, 8, 3, 17, 20),
    (1, 4, 2, 31, 100, 48), (1, 4, 1, 9, 50, 64), (1, 4, 2, 64, 64, 48), (2, 2, 2, 5, 12, 80),
])
def test_window_attention_is_sdpa(cpp_op, batch, q_heads, kv_heads, queries, keys, dim):
    """A run of queries per head with its mask (causal on the cache, a hidden key in the middle, a
    second sequence's shorter context), no mask, grouped-query heads: SDPA's result within float32
    rounding, returned with the [B, Lq, Hq, D] layout the output projection reads."""
    gen = torch.Generator().manual_seed(queries * 1000 + keys)
    q = torch.randn(batch, queries, q_heads, dim, generator=gen).transpose(1, 2)
    k = torch.randn(batch, keys, kv_heads, dim, generator=gen).transpose(1, 2)
    v = torch.randn(batch, keys, kv_heads, dim, generator=gen).transpose(1, 2)
    context = [keys - queries] + [max(0, keys - queries - 3)] * (batch - 1)
    mask = _causal_mask(batch, queries, keys, context).clone()
    mask[..., min(3, keys - 1)] = keys <= 4  # a hidden key before each row's last visible one
    for m in (mask, None):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.15, enable_gqa=True)
        got = torch.ops.wedlm_cpu.window_attention(q, k, v, m, 0.15)
        assert got.shape == want.shape and got.transpose(1, 2).is_contiguous()
        assert (got - want).abs().max().item() <= 2e-6


@pytest.mark.parametrize("batch,queries,keys,padded", [(1, 16, 70, 0), (2, 5, 33, 2), (1, 3, 3, 1)])
def test_window_attention_takes_the_causal_mask_as_key_ends(cpp_op, batch, queries, keys, padded):
    """`key_ends` [B, Lq] (query i of sequence b sees keys 0..key_ends[b, i]-1) stands for the mask
    whose rows are those prefixes, padded query rows seeing every key: the mask's output bit for
    bit, from the paged caches too; a mask and key_ends together, or ends of another shape, refused."""
    gen = torch.Generator().manual_seed(batch * 10 + queries)
    q = torch.randn(batch, queries, 4, 48, generator=gen).transpose(1, 2)
    k_cache, v_cache = torch.randn(90, 2, 48, generator=gen), torch.randn(90, 2, 48, generator=gen)
    slots = torch.stack([torch.randperm(90, generator=gen)[:keys] for _ in range(batch)])
    context = [keys - queries] + [max(0, keys - queries - 4)] * (batch - 1)
    mask = _causal_mask(batch, queries, keys, context).clone()
    ends = torch.tensor(context)[:, None] + torch.arange(1, queries + 1)
    if padded:  # the last sequence's last query rows are padding: they see every key
        mask[-1, :, queries - padded:] = True
        ends[-1, queries - padded:] = keys
    want = torch.ops.wedlm_cpu.window_attention(q, k_cache, v_cache, mask, 0.2, slots)
    got = torch.ops.wedlm_cpu.window_attention(q, k_cache, v_cache, None, 0.2, slots, ends)
    assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="give a mask or key_ends, not both"):
        torch.ops.wedlm_cpu.window_attention(q, k_cache, v_cache, mask, 0.2, slots, ends)
    with pytest.raises(RuntimeError, match=r"key_ends must be int64 \[B, Lq\]"):
        torch.ops.wedlm_cpu.window_attention(q, k_cache, v_cache, None, 0.2, slots, ends[:, :-1])


@pytest.mark.parametrize("q_heads,kv_heads,queries", [(4, 2, 16), (9, 3, 16), (6, 1, 7)])
def test_window_attention_rows_do_not_depend_on_their_tile(cpp_op, q_heads, kv_heads, queries):
    """Each query row's scores, softmax and weighted values sum in the same order whatever rows
    share its tile: the heads attended together equal each head attended alone, bit for bit."""
    gen = torch.Generator().manual_seed(q_heads + queries)
    q = torch.randn(1, queries, q_heads, 48, generator=gen).transpose(1, 2)
    k, v = (torch.randn(1, 300, kv_heads, 48, generator=gen).transpose(1, 2) for _ in range(2))
    mask = (torch.arange(300)[None, :] <= 300 - queries + torch.arange(queries)[:, None])[None, None]
    together = torch.ops.wedlm_cpu.window_attention(q, k, v, mask, 0.2)
    group = q_heads // kv_heads
    for h in range(q_heads):
        g = h // group
        alone = torch.ops.wedlm_cpu.window_attention(q[:, h:h + 1].contiguous(), k[:, g:g + 1].contiguous(),
                                                     v[:, g:g + 1].contiguous(), mask, 0.2)
        assert torch.equal(together[:, h], alone[:, 0]), h


def test_window_attention_gives_zeros_where_sdpa_does(cpp_op):
    """A query row that sees no key: zeros, as torch's CPU SDPA gives; the other rows are unaffected."""
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 5, 16)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[0, 0, 1] = False
    got = torch.ops.wedlm_cpu.window_attention(q, k, k, mask, 0.25)
    want = F.scaled_dot_product_attention(q, k, k, attn_mask=mask, scale=0.25)
    assert torch.equal(want[:, :, 1], torch.zeros(1, 2, 16)) and torch.equal(got[:, :, 1], want[:, :, 1])
    assert (got[:, :, [0, 2]] - want[:, :, [0, 2]]).abs().max().item() <= 1e-6
    with pytest.raises(RuntimeError, match=r"mask must be bool \[B or 1, 1, Lq, Lk\]"):
        torch.ops.wedlm_cpu.window_attention(q, k, k, mask.float(), 0.25)


@pytest.mark.parametrize("batch,queries,keys", [(1, 16, 70), (2, 5, 33), (1, 1, 41), (2, 1, 9)])
def test_attention_reads_the_paged_cache_in_place(cpp_op, batch, queries, keys):
    """With a slot table the kernels read keys and values in the paged caches [S, Hkv, D] where the
    table points (rows in any order): the values of the same kernels over the gathered copy, bit
    for bit."""
    gen = torch.Generator().manual_seed(batch * 100 + keys)
    q_heads, kv_heads, dim, rows = 4, 2, 48, 200
    k_cache, v_cache = torch.randn(rows, kv_heads, dim, generator=gen), torch.randn(rows, kv_heads, dim, generator=gen)
    slots = torch.stack([torch.randperm(rows, generator=gen)[:keys] for _ in range(batch)])
    k = k_cache[slots].transpose(1, 2)  # the gathered copy [B, Hkv, Lk, D]
    v = v_cache[slots].transpose(1, 2)
    q = torch.randn(batch, queries, q_heads, dim, generator=gen).transpose(1, 2)
    if queries == 1:
        want = torch.ops.wedlm_cpu.one_query_attention(q, k, v, 0.2)
        assert torch.equal(torch.ops.wedlm_cpu.one_query_attention(q, k_cache, v_cache, 0.2, slots), want)
    mask = _causal_mask(batch, queries, keys, [keys - queries] * batch)
    for m in (mask, None):
        want = torch.ops.wedlm_cpu.window_attention(q, k, v, m, 0.2)
        assert torch.equal(torch.ops.wedlm_cpu.window_attention(q, k_cache, v_cache, m, 0.2, slots), want)


def test_paged_attention_refuses_slots_outside_the_cache(cpp_op):
    q, cache = torch.randn(1, 4, 3, 16), torch.randn(10, 2, 16)
    with pytest.raises(RuntimeError, match=r"every slot must name a cache row in 0..9"):
        torch.ops.wedlm_cpu.window_attention(q, cache, cache, None, 0.2, torch.tensor([[1, 10, 2]]))
    with pytest.raises(RuntimeError, match=r"slots must be a contiguous int64 \[B, Lk\]"):
        torch.ops.wedlm_cpu.one_query_attention(q[:, :, :1], cache, cache, 0.2, torch.tensor([[1, 2]], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"caches \[S, Hkv, D\]"):
        torch.ops.wedlm_cpu.window_attention(q, cache[None], cache[None], None, 0.2, torch.tensor([[1, 2]]))


_VARIANT_CHECK = r"""
import sys, torch, torch.nn.functional as F
from torch.utils import cpp_extension
from wedlm.engine import native
cpp_extension.load(name=sys.argv[1], sources=[str(native.SOURCE)], build_directory=sys.argv[2], is_python_module=False,
                   extra_cflags=["-O3", *sys.argv[4:]], verbose=False)
gen = torch.Generator().manual_seed(0)
x, wt = torch.randn(1, 192, generator=gen), torch.randn(192, 385, generator=gen)
assert (torch.ops.wedlm_cpu.one_row_mm(x, wt) - x @ wt).abs().max() < 1e-4
from wedlm.engine.fast_model import pack_panels
for n in (16, 48, 80, 400):
    x, w, b = torch.randn(40, 192, generator=gen), torch.randn(n, 192, generator=gen), torch.randn(n, generator=gen)
    for rows in (1, 2, 5, 7, 13, 16, 17, 40):
        got = torch.ops.wedlm_cpu.few_rows_mm(x[:rows], pack_panels(w), n, b)
        assert (got - (x[:rows] @ w.t() + b)).abs().max() < 1e-4, (n, rows)
for dim in (16, 20, 48, 64, 80, 128):
    q = torch.randn(1, 9, 4, dim, generator=gen).transpose(1, 2)
    k, v = (torch.randn(1, 70, 2, dim, generator=gen).transpose(1, 2) for _ in range(2))
    mask = (torch.arange(70)[None, :] <= 61 + torch.arange(9)[:, None])[None, None]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2, enable_gqa=True)
    assert (torch.ops.wedlm_cpu.window_attention(q, k, v, mask, 0.2) - want).abs().max() < 2e-6, dim
    want = F.scaled_dot_product_attention(q[:, :, :1], k, v, scale=0.2, enable_gqa=True)
    assert (torch.ops.wedlm_cpu.one_query_attention(q[:, :, :1].contiguous(), k, v, 0.2) - want).abs().max() < 2e-6, dim
logits = 3 * torch.randn(5, 4099, generator=gen)
probs = torch.softmax(logits, -1)
h, ids = torch.ops.wedlm_cpu.greedy_scores(logits, 1e-5)
assert (h + (probs * probs.log()).sum(-1)).abs().max() < 1e-5 and ids.tolist() == probs.argmax(-1).tolist()
logits[1, 7] = float("nan")
logits[2, 5:] = logits[2].max() + 1
assert torch.ops.wedlm_cpu.row_argmax(logits).tolist() == logits.argmax(-1).tolist()
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx512", "avx2", "base", "lanes16"])
def test_each_instruction_set_build_computes_the_same(tmp_path, isa):
    """The library is built for the CPU's widest instruction set (`native.instruction_set`), so a
    machine tests its own build in the default run; here every build this CPU can run is made
    under another name and checked against torch in a fresh process (an operator library
    registers once per process). "lanes16" is the AVX-512 layout (16-float vectors, 16-row
    tiles on k-major rows) built for the CPU's own set, where GCC lowers the vectors: the AVX-512
    code paths, checked on any CPU."""
    import subprocess
    import sys

    from wedlm.engine import native

    own = native.instruction_set()
    runnable = {"avx512": ["avx512", "avx2", "base"], "avx2": ["avx2", "base"]}.get(own, ["base"]) + ["lanes16"]
    if isa not in runnable:
        pytest.skip(f"this CPU cannot run the {isa} build")
    flags = [*native.ISA_FLAGS[own], "-DWEDLM_LANES=16"] if isa == "lanes16" else native.ISA_FLAGS[isa]
    out = subprocess.run([sys.executable, "-c", _VARIANT_CHECK, f"wedlm_cpu_{isa}_check", str(tmp_path),
                          "avx512" if isa == "lanes16" else isa, *flags],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize("n,k", SHIPPED_SHAPES)
def test_few_rows_mm_of_one_row_is_one_row_mm(cpp_op, n, k):
    """One row: both sum each output's K products in order k = 0..K-1 with FMAs, so the panels
    give `one_row_mm`'s values on the transposed copy bit for bit (compiled `ar` steps switch
    from one to the other)."""
    gen = torch.Generator().manual_seed(n + k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(1, k, generator=gen)
    with torch.inference_mode():
        got = torch.ops.wedlm_cpu.few_rows_mm(x, pack_panels(w), n, None)
        assert torch.equal(got, torch.ops.wedlm_cpu.one_row_mm(x, w.t().contiguous()))


def _torch_scores(logits):
    """The exact path: torch's float32 softmax, its entropy and the argmax of the probabilities."""
    from wedlm.engine.sampling import entropy

    probs = torch.softmax(logits, -1)
    return entropy(probs), probs.argmax(-1)


@pytest.mark.parametrize("vocab", [17, 4096, 4099, 49152])
def test_greedy_scores_are_torchs_entropy_within_the_fill_tolerance(cpp_op, vocab):
    """Entropies within a tenth of the tolerance the fill rule decides by (`fill.ENTROPY_ATOL` /
    `ENTROPY_RTOL`) of the float64 entropy and within a quarter of it of torch's float32 one (whose
    own error reached 2.5e-6 x H over 49,152 columns on a Zen 3 core), from flat to one-hot rows,
    [MASK]-banned columns included; every argmax id the kernel gives is the probabilities' argmax."""
    from wedlm.engine.decoders.fill import ENTROPY_ATOL, ENTROPY_RTOL

    gen = torch.Generator().manual_seed(vocab)
    for scale in (0.01, 1.0, 3.0, 10.0, 100.0, 1e4):
        logits = scale * torch.randn(12, vocab, generator=gen)
        logits[:, 3] = float("-inf")
        logits[0, 5] = logits[0].max() + 30  # one-hot in float32
        h, ids = torch.ops.wedlm_cpu.greedy_scores(logits, 1e-5)
        want_h, want_ids = _torch_scores(logits)
        assert h.dtype == torch.float32 and ids.dtype == torch.int64 and h.shape == ids.shape == (12,)
        exact = logits.double().softmax(-1).mul(logits.double().log_softmax(-1)).nan_to_num().sum(-1).neg()
        tolerance = ENTROPY_ATOL + ENTROPY_RTOL * exact
        assert ((h - exact).abs() <= 0.1 * tolerance).all(), (scale, h - exact)
        assert ((h - want_h).abs() <= 0.25 * tolerance).all(), (scale, h - want_h)
        assert ((ids == want_ids) | (ids == -1)).all() and (ids != -1).sum() >= 11


def test_greedy_scores_flag_rows_they_cannot_vouch_for(cpp_op):
    """-1 (the caller computes the probabilities) where a second logit lies within `tie` of the
    maximum, where the maximum is repeated, and in rows with a NaN or no finite logit (entropy
    NaN); a logit farther than `tie` from the maximum is not near."""
    logits = torch.zeros(7, 100)
    logits[:, 50] = 10.0
    logits[1, 20] = 10.0 - 5e-6  # near: a second maximum after rounding
    logits[2, 60] = 10.0  # repeated maximum
    logits[3, 7] = float("nan")
    logits[4] = float("-inf")
    logits[5, 0] = float("inf")
    logits[6, 99] = 10.0 - 1e-3  # far enough
    h, ids = torch.ops.wedlm_cpu.greedy_scores(logits, 1e-5)
    assert ids.tolist() == [50, -1, -1, -1, -1, -1, 50]
    assert [x != x for x in h.tolist()] == [False, False, False, True, True, True, False]
    assert torch.ops.wedlm_cpu.greedy_scores(logits[1:2], 1e-6)[1].tolist() == [50]  # a tie below the gap
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.wedlm_cpu.greedy_scores(logits.double(), 1e-5)
    assert torch.ops.wedlm_cpu.greedy_scores(torch.zeros(0, 100), 1e-5)[0].shape == (0,)


def test_each_graph_operator_matches_its_shape_function(cpp_op):
    """Compiled CPU graphs run without inductor's size asserts (`CompiledForward`): each operator a
    graph calls must give the sizes, strides and dtype its registered shape function promises
    (`torch.library.opcheck`'s fake-tensor check), on the shapes the engine passes."""
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(160, 96, generator=gen), torch.randn(160, generator=gen)
    packed, key = pack_weight(w)  # oneDNN's copy, found by its key (kept alive for the test)
    panels = pack_panels(w)
    q_heads, kv_heads, dim = 4, 2, 48
    k_cache, v_cache = (torch.randn(90, kv_heads, dim, generator=gen) for _ in range(2))
    slots = torch.stack([torch.randperm(90, generator=gen)[:40] for _ in range(2)])
    q = torch.randn(2, 16, q_heads, dim, generator=gen).transpose(1, 2)
    mask = _causal_mask(2, 16, 40, [24, 24])
    cases = [
        (torch.ops.wedlm_cpu.linear.default, (torch.randn(16, 96, generator=gen), w, b, panels, key,
                                              PACKED_MIN_MACS, ONEDNN_MIN_ROWS, FEW_ROWS_MAX)),
        (torch.ops.wedlm_cpu.linear.default, (torch.randn(300, 96, generator=gen), w, None, None, key,
                                              PACKED_MIN_MACS, ONEDNN_MIN_ROWS, FEW_ROWS_MAX)),
        (torch.ops.wedlm_cpu.few_rows_mm.default, (torch.randn(13, 96, generator=gen), panels, 160, b)),
        (torch.ops.wedlm_cpu.one_row_mm.default, (torch.randn(1, 96, generator=gen), w.t().contiguous())),
        (torch.ops.wedlm_cpu.one_query_attention.default, (q[:, :, :1].contiguous(), k_cache, v_cache, 0.2, slots)),
        (torch.ops.wedlm_cpu.window_attention.default, (q, k_cache, v_cache, mask, 0.2, slots)),
        (torch.ops.wedlm_cpu.window_attention.default, (q[:1], k_cache[slots[0]][None].transpose(1, 2),
                                                        v_cache[slots[0]][None].transpose(1, 2), mask[:1], 0.2)),
    ]
    for op, args in cases:
        assert torch.library.opcheck(op, args, test_utils="test_faketensor") == {"test_faketensor": "SUCCESS"}


def test_row_argmax_is_torchs_argmax(cpp_op):
    """The first index of each row's maximum, as torch's argmax: ties (the first wins), all -inf,
    signed zeros, NaN (the first NaN wins), widths that are not multiples of the vector."""
    from wedlm.engine.fast_model import row_argmax

    gen = torch.Generator().manual_seed(11)
    for v in (1, 7, 16, 33, 4096, 4099):
        x = torch.randn(9, v, generator=gen)
        x[1] = float("-inf")
        x[2, v // 2:] = x[2].max() + 1  # a tie at the first of its maxima
        x[3] = 0.0
        x[3, v - 1:] = -0.0
        x[4, v // 3] = float("nan")
        x[5, v - 1] = float("nan")
        x[5, 0] = float("inf")
        x[6, v - 1] = float("inf")
        got = torch.ops.wedlm_cpu.row_argmax(x)
        assert got.dtype == torch.long and got.tolist() == x.argmax(-1).tolist(), v
        assert row_argmax(x).tolist() == got.tolist()
    with pytest.raises(RuntimeError, match=r"row_argmax: logits must be a float32 \[n, V\] matrix with V > 0"):
        torch.ops.wedlm_cpu.row_argmax(torch.randn(2, 0))
