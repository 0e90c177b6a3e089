"""`quantization="int8"`: int8 matmuls (activations per row, weights per channel) on the shipped
model; a row's result does not depend on the other rows; `verified` still equals `ar` of the same
quantized model; bad settings are clear errors. `quantization="bf16"`: bf16 weights with float32
activations on bf16 panels (a CPU with AVX512-BF16), held to the same."""

from pathlib import Path

import pytest
import torch
from torch import nn

from wedlm import LLM, SamplingParams
from wedlm.engine.chat import encode_chat
from wedlm.engine.quantize import EXACT_FLOAT_MAX_K, Int8Linear, int8_linear, int8_matmuls, quantize_int8
from wedlm.hardware import cpu_has_int8_units

MODEL = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
QUESTIONS = ["Count from 1 to 30.", "What is 47 + 38?", "Reverse the list: Tom, Anna, Ben, Mia.",
             "What is 91 - 56?"]


def test_int8_linear_is_close_to_float32():
    torch.manual_seed(0)
    ref = nn.Linear(192, 512)
    q = quantize_int8(nn.Sequential(nn.Linear(192, 512)))[0]
    q.load_state_dict(ref.state_dict())
    q.pack()
    x = torch.randn(7, 3, 192)
    with torch.no_grad():
        want, got = ref(x), q(x)
    assert isinstance(q, Int8Linear) and got.shape == want.shape == (7, 3, 512) and got.dtype == torch.float32
    # 8-bit activations and weights: about a per cent of the output's scale, never exact
    err = (got - want).abs().max() / want.abs().max()
    assert 1e-4 < err < 0.02


def test_rows_are_independent():
    """Each row's result is bit for bit the same alone or among others (int32 sums are exact)."""
    torch.manual_seed(1)
    q = quantize_int8(nn.Sequential(nn.Linear(192, 96)))[0]
    x = torch.randn(9, 192) * torch.linspace(0.1, 10, 9)[:, None]  # very different row scales
    with torch.no_grad():
        together = int8_linear(x, q.qweight_t, q.wscale, q.bias)
        alone = torch.cat([int8_linear(x[i:i + 1], q.qweight_t, q.wscale, q.bias) for i in range(9)])
    assert torch.equal(together, alone)
    assert q.qweight_t.dtype == torch.int8 and q.qweight_t.shape == (192, 96)
    assert q.qweight_t.abs().amax(dim=0).tolist() == [127] * 96  # each channel's largest weight maps to 127


@pytest.mark.parametrize("k", [192, 512, EXACT_FLOAT_MAX_K])
def test_float32_sums_of_int8_values_are_the_int32_sums(k):
    """Where the CPU has no int8 dot-product instructions the products are summed by a float32
    matmul on the int8 values: exact up to EXACT_FLOAT_MAX_K input features, also at the worst
    case (every product 127^2 with one sign), so the values are torch._int_mm's bit for bit."""
    assert EXACT_FLOAT_MAX_K == 1040 and 127 * 127 * EXACT_FLOAT_MAX_K < 2 ** 24 <= 127 * 127 * (EXACT_FLOAT_MAX_K + 1)
    gen = torch.Generator().manual_seed(k)
    q = quantize_int8(nn.Sequential(nn.Linear(k, 64)))[0]
    q.qweight_t = torch.randint(-127, 128, (k, 64), generator=gen, dtype=torch.int8)
    q.qweight_t[:, 0] = 127  # a column whose every product is 127^2 for the row below
    x = torch.randn(17, k, generator=gen) * torch.linspace(0.1, 10, 17)[:, None]
    x[0] = 1.0  # quantizes to 127 everywhere
    with torch.no_grad():
        want = int8_linear(x, q.qweight_t, q.wscale, q.bias)
        got = int8_linear(x, q.qweight_t, q.wscale, q.bias, q.qweight_t.float())
    assert torch.equal(got, want)


def test_int8_values_on_column_panels_are_the_int32_sums():
    """Compiled int8 engines on such a CPU run the float32 sums on column panels of the int8
    values (`use_int8_panels`): `few_rows_mm`'s FMA chains of integers are exact too."""
    from wedlm.engine import native
    from wedlm.engine.fast_model import pack_panels

    if not native.load():
        pytest.skip("the engine's C++ operators cannot be built here")
    gen = torch.Generator().manual_seed(3)
    q = quantize_int8(nn.Sequential(nn.Linear(EXACT_FLOAT_MAX_K, 64)))[0]
    q.qweight_t = torch.randint(-127, 128, (EXACT_FLOAT_MAX_K, 64), generator=gen, dtype=torch.int8)
    q.qweight_t[:, 0] = 127
    fweight_t = q.qweight_t.float()
    fpanels = pack_panels(fweight_t.t())
    x = torch.randn(13, EXACT_FLOAT_MAX_K, generator=gen) * torch.linspace(0.1, 10, 13)[:, None]
    x[0] = 1.0
    with torch.no_grad():
        for rows in (1, 13):
            want = int8_linear(x[:rows], q.qweight_t, q.wscale, q.bias)
            assert torch.equal(int8_linear(x[:rows], q.qweight_t, q.wscale, q.bias, fweight_t, fpanels), want)
        xq = torch.round(x / (x.abs().amax(-1, keepdim=True) / 127.0))
        ints = torch._int_mm(xq.to(torch.int8), q.qweight_t).float()
        assert torch.equal(torch.ops.wedlm_cpu.few_rows_mm(xq, fpanels, 64, None), ints)


def test_the_float32_path_is_taken_without_int8_units(monkeypatch):
    """`pack` keeps the int8 values as float32 only on a CPU without VNNI / AMX and only for
    layers whose sums it computes exactly."""
    from wedlm.engine import quantize

    assert cpu_has_int8_units({"avx512_vnni"}) and cpu_has_int8_units({"avx_vnni"}) and cpu_has_int8_units({"amx_int8"})
    assert not cpu_has_int8_units({"avx2", "fma", "avx512f"})
    for units, k, kept in [(False, 192, True), (False, EXACT_FLOAT_MAX_K + 1, False), (True, 192, False)]:
        monkeypatch.setattr(quantize, "cpu_has_int8_units", lambda units=units: units)
        q = quantize_int8(nn.Sequential(nn.Linear(k, 32)))[0]
        assert (q.fweight_t is not None) is kept
        if kept:
            assert q.fweight_t.dtype == torch.float32 and torch.equal(q.fweight_t, q.qweight_t.float())
        assert ("torch._int_mm" in quantize.int8_matmuls()) is units


@pytest.fixture(scope="module")
def int8_llm():
    return LLM(str(MODEL), device="cpu", quantization="int8")


def test_every_matmul_is_int8(int8_llm):
    model = int8_llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 8 * 7 + 1 and all(type(m) is Int8Linear for m in linears)
    assert model.dtype == torch.float32  # the float32 parameters stay (state dict, tied embedding)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "int8" in int8_llm.engine.precision and int8_llm.engine.matmuls == int8_matmuls()


def test_verified_equals_ar_under_int8(int8_llm):
    prompts = [encode_chat(int8_llm.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    params = {d: SamplingParams(temperature=0, max_tokens=48, decoding=d) for d in ("ar", "verified", "wedlm")}
    ar = int8_llm.generate(prompts, params["ar"])
    ver = int8_llm.generate(prompts, params["verified"])
    assert [o["token_ids"] for o in ver] == [o["token_ids"] for o in ar]
    # batch invariance: each prompt alone decodes as in the batch of four
    assert [int8_llm.generate([p], params["ar"])[0]["token_ids"] for p in prompts] == [o["token_ids"] for o in ar]
    # the quantized model still answers these held-out-style prompts
    assert ar[1]["text"].endswith("85") and ar[2]["text"] == "Mia, Ben, Anna, Tom"
    wedlm = int8_llm.generate(prompts, params["wedlm"])
    assert wedlm[0]["stats"]["tokens_per_forward"] > 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"quantization": "int4"}, "quantization must be None or one of 'int8', 'bf16', got 'int4'"),
    ({"quantization": "int8", "dtype": "bfloat16"}, "quantizes float32 weights, got dtype='bfloat16'"),
    ({"quantization": "int8", "autocast": True}, "runs in one process without autocast"),
    ({"quantization": "int8", "tensor_parallel_size": 2}, "runs in one process without autocast"),
    ({"quantization": "bf16", "dtype": "bfloat16"}, "quantizes float32 weights, got dtype='bfloat16'"),
    ({"quantization": "bf16", "autocast": True}, "runs in one process without autocast"),
])
def test_bad_quantization_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(MODEL), device="cpu", **kwargs)


def test_cli_rejects_unknown_quantization(capsys):
    from wedlm.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["generate", "--quantization", "int4", "hi"])
    assert exc.value.code == 2
    assert "argument --quantization: invalid choice: 'int4'" in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_int8_equals_eager_int8(int8_llm):
    compiled = LLM(str(MODEL), device="cpu", quantization="int8", enforce_eager=False)
    # where the int8 products are summed in float32, the compiled engine reads them from column panels
    panels = [m.fpanels is not None for m in compiled.engine.runner.model.modules() if isinstance(m, Int8Linear)]
    assert all(panels) == (compiled.engine.runner.native_ops and not cpu_has_int8_units()) and len(panels) == 57
    prompts = [encode_chat(int8_llm.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS[:2]]
    for decoding in ("ar", "wedlm"):
        params = SamplingParams(temperature=0, max_tokens=32, decoding=decoding)
        assert [o["token_ids"] for o in compiled.generate(prompts, params)] == \
            [o["token_ids"] for o in int8_llm.generate(prompts, params)]


@pytest.mark.parametrize("int8_units", [True, False])
def test_an_int8_window_runs_unpadded_with_the_same_logits(int8_units, monkeypatch):
    """A compiled int8 engine runs one sequence's window as it is, not padded to its token bucket:
    its int8 products are exact integer sums (`torch._int_mm`, or float32 sums of int8 values where
    the CPU has no int8 units) and the engine's attention reads each query's keys alone, so every
    real row's logits equal, bit for bit, those of the same window padded."""
    from engine_test_util import window_logits_unpadded_and_padded

    from wedlm.engine import quantize

    monkeypatch.setattr(quantize, "cpu_has_int8_units", lambda: int8_units)
    runner = LLM(str(MODEL), device="cpu", quantization="int8", enforce_eager=False).engine.runner
    if not runner.native_ops:
        pytest.skip("the engine's C++ operators did not load: tokens stay in buckets")
    assert runner.rows_alone and not runner.panel_weights
    assert all((m.fweight_t is None) is int8_units for m in runner.model.modules() if isinstance(m, Int8Linear))
    for n, ctx in [(3, 70), (6, 33), (12, 90)]:
        got, want = window_logits_unpadded_and_padded(runner, monkeypatch, n, ctx)
        assert got.shape == want.shape == (n - 1, 4096) and torch.equal(got, want)


@pytest.fixture(scope="module")
def bf16_llm():
    from wedlm.engine.fast_model import bf16_panels_supported, use_native_ops

    if not (use_native_ops() and bf16_panels_supported()):
        pytest.skip("needs a CPU with AVX512-BF16 and the C++ operators")
    return LLM(str(MODEL), device="cpu", quantization="bf16")


def test_bf16_weights_run_every_matmul_on_bf16_panels(bf16_llm):
    """quantization="bf16": every matmul (fused q/k/v and gate/up, o, down, the tied lm_head) reads
    bf16 panels of its float32 weight rounded to bf16; the parameters, embedding and KV cache stay
    float32, and so do the logits' rows of one forward, within bf16 weight rounding of float32's."""
    from wedlm.engine.fast_model import _matmuls, pack_panels
    from wedlm.engine.runner import ForwardItem

    runner = bf16_llm.engine.runner
    targets = _matmuls(runner.model)
    assert len(targets) == 4 * 8 + 1 and runner.panel_weights and runner.autocast is None
    for module, weight in targets:
        assert weight.dtype == torch.float32
        assert torch.equal(module.weight_panels, pack_panels(weight.bfloat16()))
    assert runner.model.dtype == runner.kv_cache.k[0].dtype == torch.float32
    assert bf16_llm.engine.precision == "float32 weights rounded to bf16 for the matmuls, float32 activations"
    item = ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0, 3], 0, [0, 1, 2, 3])
    float32 = LLM(str(MODEL), device="cpu", autocast=False)
    a, b = runner.run([item])[0].logits, float32.engine.runner.run([item])[0].logits
    assert a.dtype == torch.float32 and not torch.equal(a, b)
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite)
    assert (a[finite] - b[finite]).abs().max() <= 0.02 * b[finite].abs().max()


def test_verified_equals_ar_under_bf16_weights(bf16_llm):
    prompts = [encode_chat(bf16_llm.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    params = {d: SamplingParams(temperature=0, max_tokens=48, decoding=d) for d in ("ar", "verified")}
    ar = bf16_llm.generate(prompts, params["ar"])
    assert [o["token_ids"] for o in bf16_llm.generate(prompts, params["verified"])] == [o["token_ids"] for o in ar]
    assert [bf16_llm.generate([p], params["ar"])[0]["token_ids"] for p in prompts] == [o["token_ids"] for o in ar]
    assert ar[1]["text"].endswith("85") and ar[2]["text"] == "Mia, Ben, Anna, Tom"


def test_bf16_weights_need_the_bf16_kernel(monkeypatch):
    """Where `few_rows_mm` cannot multiply bf16 panels the engine refuses quantization="bf16"
    with an error naming it, instead of running another precision."""
    from wedlm.engine import fast_model

    monkeypatch.setattr(fast_model, "bf16_panels_supported", lambda: False)
    with pytest.raises(ValueError, match="quantization='bf16' needs a CPU with AVX512-BF16"):
        LLM(str(MODEL), device="cpu", quantization="bf16")


@pytest.mark.slow
def test_compiled_bf16_weights_equal_eager_bf16_weights(bf16_llm):
    compiled = LLM(str(MODEL), device="cpu", quantization="bf16", enforce_eager=False)
    assert compiled.engine.runner.native_ops and compiled.engine.runner.panel_weights
    prompts = [encode_chat(bf16_llm.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS[:2]]
    for decoding in ("ar", "wedlm"):
        params = SamplingParams(temperature=0, max_tokens=32, decoding=decoding)
        assert [o["token_ids"] for o in compiled.generate(prompts, params)] == \
            [o["token_ids"] for o in bf16_llm.generate(prompts, params)]
    # every matmul bound to its bf16 panels (`fast_model.bind_linears`), called as a C function
    from wedlm.engine.compiled import compiled_fx_graph

    for direct in compiled.engine.runner.compiled._direct:
        source = compiled_fx_graph(direct.graph.fn).source_code
        assert "aoti_torch_cpu_bound_linear(" in source and 'dispatcher("wedlm_cpu::linear"' not in source
