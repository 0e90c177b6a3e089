"""bf16 autocast on CPU: chosen from the processor's bf16 matrix units, forced by `autocast=True`
(this machine may have none: the bf16 path is checked for correctness here, not speed)."""

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.config import resolve_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("requested,device,dtype,flags,expected", [
    (None, CPU, "float32", {"avx2"}, None),
    (None, CPU, "float32", {"avx2", "amx_bf16"}, torch.bfloat16),
    (None, CPU, "float32", {"avx512_bf16"}, torch.bfloat16),
    (None, CUDA, "float32", {"amx_bf16"}, None),
    (None, CPU, "bfloat16", {"amx_bf16"}, None),
    (True, CPU, "float32", {"avx2"}, torch.bfloat16),
    (False, CPU, "float32", {"amx_bf16"}, None),
])
def test_resolve_precision_picks_autocast(requested, device, dtype, flags, expected):
    assert resolve_precision(requested, device, dtype, flags)[0] is expected


@pytest.mark.parametrize("requested,hidden,expected,why", [
    (None, 192, None, "no autocast (auto: hidden size 192 < 512, fp32 is as fast)"),
    (None, 511, None, "no autocast (auto: hidden size 511 < 512, fp32 is as fast)"),
    (None, 512, torch.bfloat16, "bf16 autocast (auto: CPU has bf16 matrix units)"),
    (None, 4096, torch.bfloat16, "bf16 autocast (auto: CPU has bf16 matrix units)"),
    (True, 192, torch.bfloat16, "bf16 autocast (forced)"),
    (False, 4096, None, "no autocast (off)"),
])
def test_automatic_autocast_needs_a_hidden_size_of_512(requested, hidden, expected, why):
    flags = {"amx_bf16"}
    assert resolve_precision(requested, CPU, "float32", flags, hidden) == (expected, f"float32 weights, {why}")
    assert resolve_precision(None, CPU, "float32", {"avx2"}, hidden)[1] == \
        "float32 weights, no autocast (auto: no bf16 matrix units)"


def test_engine_reports_the_size_rule(tiny_path, monkeypatch):
    """The tiny test model (hidden size below 512) stays fp32 under automatic precision even on
    a CPU with bf16 units."""
    monkeypatch.setenv("WEDLM_CPU_BF16", "1")
    llm = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu")
    hidden = llm.engine.model.config.hidden_size
    assert hidden < 512 and llm.engine.runner.autocast is None
    assert llm.engine.precision == f"float32 weights, no autocast (auto: hidden size {hidden} < 512, fp32 is as fast)"


def test_forced_autocast_needs_float32_weights():
    with pytest.raises(ValueError, match="autocast=True needs float32 weights"):
        resolve_precision(True, CPU, "bfloat16", set())


def test_forced_bf16_autocast_runs_in_bf16_and_stays_close(tiny_path):
    plain = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=False)
    bf16 = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    assert bf16.engine.precision == "float32 weights, bf16 autocast (forced)"
    assert plain.engine.precision == "float32 weights, no autocast (off)"
    seen = []
    bf16.engine.runner.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    params = SamplingParams(temperature=0.0, max_tokens=6, decoding="ar", ignore_eos=True)
    out = bf16.generate([[5, 9, 14]], params)[0]
    assert len(out["token_ids"]) == 6 and seen and set(seen) == {torch.bfloat16}
    # one forward's logits: bf16 against fp32, within bf16 rounding of their scale
    from wedlm.engine.runner import ForwardItem

    item = ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0], 0, [0, 1, 2, 3])
    a = plain.engine.runner.run([item])[0].logits
    b = bf16.engine.runner.run([item])[0].logits
    assert b.dtype == torch.float32
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    assert (a[finite] - b[finite]).abs().max() <= 0.05 * a[finite].abs().max()


def test_autocast_reads_precast_bf16_weights_with_the_same_logits(tiny_path):
    """Under autocast the runner keeps bf16 copies of the matmul weights (no per-forward casts):
    the logits equal those of autocast over the float32 weights exactly, and the parameters,
    the embedding and the KV cache stay float32."""
    from wedlm.engine.fast_model import PrecastLinear, optimize_for_inference
    from wedlm.engine.runner import ForwardItem
    from wedlm.model import load_model

    precast = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    reference = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    reference.engine.runner.model = optimize_for_inference(load_model(str(tiny_path)).eval())
    model = precast.engine.runner.model
    assert isinstance(model.lm_head, PrecastLinear) and model.lm_head.weight16.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.qkv_weight.dtype == torch.bfloat16
    assert model.model.layers[0].mlp.gate_up_weight.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert precast.engine.runner.kv_cache.k[0].dtype == torch.float32
    items = [ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0], 0, [0, 1, 2, 3])]
    a = precast.engine.runner.run(items)[0].logits
    b = reference.engine.runner.run(items)[0].logits
    assert torch.equal(a, b)
    params = SamplingParams(temperature=0.0, max_tokens=8, decoding="wedlm", ignore_eos=True)
    assert precast.generate([[5, 9, 14]], params)[0]["token_ids"] == \
        reference.generate([[5, 9, 14]], params)[0]["token_ids"]


def _precast_model(tiny_path):
    from wedlm.engine.fast_model import optimize_for_inference, precast_for_autocast
    from wedlm.model import load_model

    return precast_for_autocast(optimize_for_inference(load_model(str(tiny_path)).eval()), torch.bfloat16)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_bf16_panels_run_every_matmul_of_a_precast_model(tiny_path):
    """On a CPU with AVX512-BF16 a precast model's matmuls get bf16 column panels (`use_panel_weights`),
    which q/k/v, o, gate/up, down and lm_head then read: under autocast each module gives what it
    gave on its bf16 weights, within a bf16 unit and float32 summation order."""
    import torch.nn.functional as F

    from wedlm.engine import fast_model
    from wedlm.engine.fast_model import (
        _matmul,
        _matmuls,
        bf16_panels_supported,
        pack_panels,
        use_native_ops,
        use_panel_weights,
    )
    from wedlm.hardware import cpu_flags

    if not (use_native_ops() and bf16_panels_supported()):  # the support check needs the operators loaded
        pytest.skip("needs a CPU with AVX512-BF16 and the C++ operators")
    model = _precast_model(tiny_path)
    reference = _precast_model(tiny_path)
    assert use_panel_weights(model)
    amx = "amx_bf16" in cpu_flags()
    assert fast_model._bf16_few_rows_max == (fast_model.BF16_AMX_FEW_ROWS_MAX if amx else fast_model.FEW_ROWS_MAX)
    targets = _matmuls(model)
    assert len(targets) == 4 * model.config.num_hidden_layers + 1
    for module, weight in targets:
        assert weight.dtype == torch.bfloat16 and torch.equal(module.weight_panels, pack_panels(weight))
    gen = torch.Generator().manual_seed(0)
    layer, ref_layer = model.model.layers[0], reference.model.layers[0]
    attn, o_in = layer.self_attn, layer.self_attn.o_proj.in_features
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for rows in (1, 7, 40):  # 40 rows: oneDNN on a CPU with AMX
            x = torch.randn(rows, model.config.hidden_size, generator=gen)
            pairs = [(model.lm_head(x), reference.lm_head(x)), (layer.mlp(x), ref_layer.mlp(x)),
                     (attn.o_proj(x[:, :o_in]), ref_layer.self_attn.o_proj(x[:, :o_in])),
                     (_matmul(attn, x, attn.qkv_weight, attn.qkv_bias), F.linear(x, attn.qkv_weight, attn.qkv_bias))]
            for got, want in pairs:
                assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
                assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
                assert (got == want).float().mean() >= 0.9


@pytest.mark.parametrize("why", ["cpu", "compiler"])
def test_no_bf16_panels_without_avx512_bf16(tiny_path, monkeypatch, why):
    """Where the CPU cannot run the bf16 kernel, or the C++ operators were built by a compiler
    without it, the precast model keeps F.linear on its bf16 weights."""
    from wedlm.engine import fast_model

    fast_model.use_native_ops()
    if why == "cpu":
        monkeypatch.setattr(fast_model, "bf16_panels_supported", lambda: False)
    else:
        monkeypatch.setattr(fast_model, "_bf16_kernel", False)
    model = _precast_model(tiny_path)
    assert not fast_model.use_panel_weights(model)
    assert all(module.weight_panels is None for module, _ in fast_model._matmuls(model))


def _torch_autocast_reference(tiny_path, **kw):
    """An eager engine whose model runs torch's own autocast over the float32 weights (no bf16
    copies, no panels): the reference the engine's bf16 matmuls are held to."""
    from wedlm.engine.fast_model import optimize_for_inference
    from wedlm.model import load_model

    reference = LLM(str(tiny_path), enforce_eager=True, **kw)
    reference.engine.runner.model = optimize_for_inference(load_model(str(tiny_path)).eval())
    return reference


def _close_logits(a, b):
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite)
    assert (a[finite] - b[finite]).abs().max() <= 0.02 * b[finite].abs().max()


def test_eager_bf16_autocast_reads_bf16_panels(tiny_path):
    """An eager engine under bf16 autocast on a CPU with AVX512-BF16 runs its matmuls on bf16
    panels too (the C++ operators loaded, the forward still eager): one forward's logits within
    bf16 rounding of torch's autocast, and the start log says so."""
    from wedlm.engine.fast_model import bf16_panels_supported, use_native_ops
    from wedlm.engine.runner import ForwardItem

    if not (use_native_ops() and bf16_panels_supported()):
        pytest.skip("needs a CPU with AVX512-BF16 and the C++ operators")
    kw = dict(kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    eager = LLM(str(tiny_path), enforce_eager=True, **kw)
    assert eager.engine.runner.panel_weights and not eager.engine.runner.native_ops
    assert "eager few-row bf16 matmuls on bf16 column panels" in eager.engine.matmuls
    item = ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0, 3], 0, [0, 1, 2, 3])
    _close_logits(eager.engine.runner.run([item])[0].logits,
                  _torch_autocast_reference(tiny_path, **kw).engine.runner.run([item])[0].logits)
    float32 = LLM(str(tiny_path), enforce_eager=True, kv_block_size=4, wedlm_window_size=4, device="cpu",
                  autocast=False)
    assert not float32.engine.runner.panel_weights  # float32 eager stays the BLAS reference


@pytest.mark.slow
def test_compiled_bf16_autocast_reads_bf16_panels(tiny_path):
    """A compiled engine under bf16 autocast on a CPU with AVX512-BF16 runs its matmuls on bf16
    panels: one forward's logits within bf16 rounding of torch's autocast (the tiny random
    model's greedy tokens part at its many near ties under any change of rounding)."""
    from wedlm.engine.fast_model import bf16_panels_supported, use_native_ops
    from wedlm.engine.runner import ForwardItem

    if not (use_native_ops() and bf16_panels_supported()):
        pytest.skip("needs a CPU with AVX512-BF16")
    torch._dynamo.reset()
    kw = dict(kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    compiled = LLM(str(tiny_path), enforce_eager=False, **kw)
    assert compiled.engine.runner.panel_weights and compiled.engine.runner.native_ops
    item = ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0, 3], 0, [0, 1, 2, 3])
    _close_logits(compiled.engine.runner.run([item])[0].logits,
                  _torch_autocast_reference(tiny_path, **kw).engine.runner.run([item])[0].logits)
    params = SamplingParams(temperature=0.0, max_tokens=8, decoding="ar", ignore_eos=True)
    assert len(compiled.generate([[5, 9, 14]], params)[0]["token_ids"]) == 8


def test_automatic_bf16_is_bf16_weights_where_the_panels_run(ckpt_factory, monkeypatch):
    """Automatic precision on a CPU with bf16 units, for a model of hidden size >= 512: bf16
    weights with float32 activations where `few_rows_mm` multiplies bf16 panels, bf16 autocast
    where it cannot; an explicit `autocast=True` keeps autocast."""
    from wedlm.engine import config as engine_config
    from wedlm.engine.fast_model import bf16_panels_supported, use_native_ops

    monkeypatch.setenv("WEDLM_CPU_BF16", "1")
    wide = ckpt_factory("wide", family="qwen3", wedlm=True, tokenizer=True, seed=0, hidden_size=512,
                        intermediate_size=512, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64)
    kw = dict(kv_block_size=4, wedlm_window_size=4, device="cpu", num_kv_blocks=32)
    forced = LLM(str(wide), autocast=True, **kw).engine
    assert forced.runner.autocast == torch.bfloat16 and forced.quantization is None
    if use_native_ops() and bf16_panels_supported():
        auto = LLM(str(wide), **kw).engine
        assert auto.runner.autocast is None and auto.quantization == "bf16" and auto.runner.panel_weights
        assert auto.precision == ("float32 weights rounded to bf16 for the matmuls, float32 activations "
                                  "(auto: CPU has bf16 matrix units)")
    monkeypatch.setattr(engine_config, "bf16_panels_supported", lambda: False)
    fallback = LLM(str(wide), **kw).engine
    assert fallback.runner.autocast == torch.bfloat16 and fallback.quantization is None
    assert fallback.precision == "float32 weights, bf16 autocast (auto: CPU has bf16 matrix units)"


def test_automatic_bf16_falls_back_to_autocast_where_the_panels_do_not_fit(ckpt_factory, monkeypatch):
    """A model whose matmuls cannot take bf16 panels (a vocabulary of 264: lm_head's out_features
    is not a multiple of 16) runs the automatic bf16 as autocast; asking for bf16 weights is an
    error that names the cause."""
    from wedlm.engine.fast_model import bf16_panels_supported, use_native_ops

    monkeypatch.setenv("WEDLM_CPU_BF16", "1")
    odd = ckpt_factory("wide_odd_vocab", family="qwen3", wedlm=True, tokenizer=True, seed=0, hidden_size=512,
                       intermediate_size=512, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, vocab_size=264)
    kw = dict(kv_block_size=4, wedlm_window_size=4, device="cpu", num_kv_blocks=32)
    auto = LLM(str(odd), **kw).engine
    assert auto.runner.autocast == torch.bfloat16 and auto.quantization is None
    if use_native_ops() and bf16_panels_supported():
        with pytest.raises(ValueError, match=r"quantization='bf16' needs out_features that are multiples of 16 "
                                             r"\(a matmul weight is \(264, 512\)\)"):
            LLM(str(odd), quantization="bf16", **kw)
