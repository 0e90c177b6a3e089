"""Float32 matmuls by oneDNN (`fast_model.use_onednn_linear`): chosen from the CPU, the same
arithmetic as F.linear up to float32 summation order, the same greedy tokens in the engine."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from wedlm import LLM, SamplingParams
from wedlm.engine import fast_model
from wedlm.engine.compiled import compiled_fx_graph
from wedlm.engine.config import resolve_cpu_linear
from wedlm.engine.defaults import DECODERS
from wedlm.engine.fast_model import (
    ONEDNN_MIN_ROWS,
    PACKED_MIN_MACS,
    OneDNNLinear,
    onednn_linear,
    optimize_for_inference,
    pack_weight,
    use_onednn_linear,
)
from wedlm.hardware import cpu_prefers_onednn_linear, cpu_vendor
from wedlm.model import DenseAttention, load_model

CPU = torch.device("cpu")
SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"


@pytest.mark.parametrize("vendor,flags,expected", [
    ("AuthenticAMD", {"avx2", "avx512f", "avx512_bf16"}, True),
    ("AuthenticAMD", {"avx2"}, False),
    ("GenuineIntel", {"avx2", "avx512f", "amx_bf16"}, False),
    ("", set(), False),
])
def test_the_cpu_rule(vendor, flags, expected):
    assert cpu_prefers_onednn_linear(vendor, flags)[0] is expected


def test_vendor_is_read_from_cpuinfo():
    assert cpu_vendor("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t: fpu\n") == "AuthenticAMD"
    assert cpu_vendor("processor\t: 0\n") == ""


def test_the_environment_overrides_the_rule(monkeypatch):
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "onednn")
    assert cpu_prefers_onednn_linear() == (True, "WEDLM_CPU_LINEAR=onednn")
    assert resolve_cpu_linear(CPU, "float32", None) == (True, "oneDNN float32 matmuls on prepacked weights (WEDLM_CPU_LINEAR=onednn)")
    # never for other devices, dtypes, autocast or tensor-parallel ranks
    assert not resolve_cpu_linear(torch.device("cuda"), "float32", None)[0]
    assert not resolve_cpu_linear(CPU, "bfloat16", None)[0]
    assert not resolve_cpu_linear(CPU, "float32", torch.bfloat16)[0]
    assert not resolve_cpu_linear(CPU, "float32", None, tensor_parallel_size=2)[0]
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "blas")
    assert resolve_cpu_linear(CPU, "float32", None) == (False, "BLAS float32 matmuls (WEDLM_CPU_LINEAR=blas)")
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "mkl")
    with pytest.raises(ValueError, match="WEDLM_CPU_LINEAR must be 'onednn' or 'blas', got 'mkl'"):
        cpu_prefers_onednn_linear()


def _ops(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("rows", [1, ONEDNN_MIN_ROWS - 1, ONEDNN_MIN_ROWS, 40])
def test_onednn_linear_equals_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 3, 96, generator=gen)  # 3 * rows rows in all
    w, b = torch.randn(160, 96, generator=gen), torch.randn(160, generator=gen)
    want = F.linear(x, w, b)
    got = onednn_linear(x, w, b)
    assert got.shape == (rows, 3, 160)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    ops = _ops(lambda: onednn_linear(x, w, b))
    assert ("mkldnn::_linear_pointwise" in ops) is (3 * rows >= ONEDNN_MIN_ROWS)


def test_below_the_row_count_and_in_bf16_it_is_f_linear():
    x, w = torch.randn(ONEDNN_MIN_ROWS - 1, 64), torch.randn(32, 64)
    assert torch.equal(onednn_linear(x, w), F.linear(x, w))
    xb, wb = torch.randn(64, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    assert torch.equal(onednn_linear(xb, wb), F.linear(xb, wb))
    assert "mkldnn::_linear_pointwise" not in _ops(lambda: onednn_linear(xb, wb))


# a [160, 96] weight: 15,360 multiply-adds a row, PACKED_MIN_MACS from 35 rows
PACKED_ROWS = -(-PACKED_MIN_MACS // (160 * 96))


@pytest.mark.parametrize("rows", [1, 2, PACKED_ROWS - 1, PACKED_ROWS, 80])
def test_a_prepacked_weight_gives_f_linear_by_its_own_rule(rows):
    """oneDNN on a prepacked weight from 2 rows and PACKED_MIN_MACS multiply-adds (fewer than
    the unpacked rule's ONEDNN_MIN_ROWS rows for a large weight, more for a small one)."""
    gen = torch.Generator().manual_seed(10 + rows)
    x = torch.randn(rows, 96, generator=gen)
    w, b = torch.randn(160, 96, generator=gen), torch.randn(160, generator=gen)
    packed, key = pack_weight(w)
    assert packed.layout == torch._mkldnn and packed.shape == (160, 96) and key > 0
    want = F.linear(x, w, b)
    got = onednn_linear(x, w, b, packed_key=key)
    assert got.shape == (rows, 160)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    ops = _ops(lambda: onednn_linear(x, w, b, packed_key=key))
    assert ("mkldnn::_linear_pointwise" in ops) is (rows >= PACKED_ROWS)
    if rows < PACKED_ROWS:
        assert torch.equal(got, want)
    # a weight 4096 x 192 (the shipped lm_head): oneDNN from 2 rows, F.linear at 1
    wide = torch.randn(4096, 192, generator=gen)
    _, wide_key = pack_weight(wide)
    for n, expected in ((1, False), (2, True)):
        ops = _ops(lambda n=n: onednn_linear(torch.randn(n, 192), wide, packed_key=wide_key))
        assert ("mkldnn::_linear_pointwise" in ops) is expected


def test_a_packed_weight_lives_as_long_as_its_owner():
    """The registry holds weak references: a dropped packed tensor frees its key, and a call
    with that key falls back to the unpacked rule (F.linear below ONEDNN_MIN_ROWS rows)."""
    import gc

    w = torch.randn(4096, 192)
    x = torch.randn(3, 192)  # 3 x 786,432 multiply-adds: oneDNN while the packed weight lives
    packed, key = pack_weight(w)
    assert fast_model._packed(key) is packed
    assert "mkldnn::_linear_pointwise" in _ops(lambda: onednn_linear(x, w, packed_key=key))
    del packed
    gc.collect()
    assert key not in fast_model._PACKED and fast_model._packed(key) is None
    assert "mkldnn::_linear_pointwise" not in _ops(lambda: onednn_linear(x, w, packed_key=key))
    assert torch.equal(onednn_linear(x, w, packed_key=key), F.linear(x, w))


def test_model_matmuls_go_through_onednn_with_the_same_logits(ckpt_factory):
    path = ckpt_factory("fast_qwen2", family="qwen2", seed=5)  # q/k/v biases: the fused bias too
    ref = optimize_for_inference(load_model(path))
    fast = use_onednn_linear(optimize_for_inference(load_model(path)))
    assert isinstance(fast.lm_head, OneDNNLinear) and isinstance(fast.model.layers[0].self_attn.o_proj, OneDNNLinear)
    assert fast.model.layers[0].self_attn.onednn and fast.model.layers[0].mlp.onednn
    # every matmul weight prepacked once, each under its own key
    owners = [fast.lm_head] + [m for layer in fast.model.layers
                               for m in (layer.self_attn, layer.self_attn.o_proj, layer.mlp, layer.mlp.down_proj)]
    keys = [m.packed_key for m in owners]
    assert 0 not in keys and len(set(keys)) == len(keys)
    assert fast_model._packed(fast.lm_head.packed_key) is fast.lm_head.packed_weight
    assert fast.state_dict().keys() == ref.state_dict().keys()
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(40).expand(1, 40)
    with torch.no_grad():
        a, b = ref(ids, pos, DenseAttention()), fast(ids, pos, DenseAttention())
        # 40 rows: lm_head [256x64] and gate/up [256x64] pass PACKED_MIN_MACS (655,360), the
        # q/k/v [128x64], o_proj and down_proj do not (F.linear)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            fast(ids, pos, DenseAttention())
    assert (a - b).abs().max().item() < 1e-5
    shapes = sorted({tuple(e.input_shapes[1]) for e in prof.events() if e.name == "mkldnn::_linear_pointwise"})
    assert shapes == [(256, 64)]
    assert use_onednn_linear(load_model(path, dtype="bfloat16")).lm_head.__class__ is torch.nn.Linear


def _mixed_batch(llm):
    prompts = [list(range(5, 5 + n)) for n in (3, 20, 9, 33)]
    out = []
    for decoding in ("ar", "wedlm", "blockwise", "verified"):
        params = SamplingParams(temperature=0.0, max_tokens=24, decoding=decoding, ignore_eos=True,
                                wedlm_entropy_threshold=5.0)
        out.append([o["token_ids"] for o in llm.generate(prompts, params)])
    return out


def test_engine_tokens_equal_blas(tiny_path, monkeypatch):
    """Every decoder's greedy tokens in one mixed batch (prefills of 3-33 tokens, windows of 16):
    the same with BLAS and with oneDNN matmuls."""
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "blas")
    blas = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=16, device="cpu")
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "onednn")
    onednn = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=16, device="cpu")
    assert blas.engine.matmuls.startswith("BLAS") and onednn.engine.matmuls.startswith("oneDNN")
    assert isinstance(onednn.engine.runner.model.lm_head, OneDNNLinear)
    assert _mixed_batch(onednn) == _mixed_batch(blas)


def test_compiled_onednn_equals_eager(tiny_path, monkeypatch):
    """Under torch.compile the oneDNN matmul is an opaque operator, the C++ one
    (`wedlm_cpu::bound_linear`, `native.py`, called as a C function) on a machine that builds it: the compiled engine
    gives the eager engine's tokens."""
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "onednn")
    eager = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=16, device="cpu")
    compiled = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=16, device="cpu", enforce_eager=False)
    assert compiled.engine.runner.native_ops and not eager.engine.runner.native_ops
    assert compiled.engine.matmuls.endswith("; compiled matmuls of 1 to 256 rows on column panels; the compiled "
                                            "forward's matmuls and attention by the engine's C++ operators")
    # the column panels replace the transposed copies: an eager one-row matmul (a logits-free
    # chunk of one token) runs on them too, with the one-row kernel's values bit for bit
    runner = compiled.engine.runner
    matmuls = fast_model._matmuls(runner.model)
    assert runner.panel_weights and len(matmuls) == 4 * runner.model.config.num_hidden_layers + 1
    assert all(m.weight_panels is not None and m.weight_t is None for m, _ in matmuls)
    attn = runner.model.model.layers[0].self_attn
    x = torch.randn(1, 1, attn.qkv_weight.shape[1], generator=torch.Generator().manual_seed(5))
    got = fast_model._matmul(attn, x, attn.qkv_weight)
    assert got.shape == (1, 1, attn.qkv_weight.shape[0])
    assert torch.equal(got[0], torch.ops.wedlm_cpu.one_row_mm(x[0], attn.qkv_weight.t().contiguous()))
    prompts = [list(range(5, 25)), list(range(7, 12))]
    for decoding in ("ar", "wedlm"):
        params = SamplingParams(temperature=0.0, max_tokens=20, decoding=decoding, ignore_eos=True,
                                wedlm_entropy_threshold=5.0)
        want = [o["token_ids"] for o in eager.generate(prompts, params)]
        got = []
        ops = _ops(lambda got=got, params=params: got.extend(
            o["token_ids"] for o in compiled.generate(prompts, params)))
        assert got == want
        # the graph calls each matmul's bound C++ operator as a C function (`native.C_SHIMS`): no
        # dispatched op of its own, and neither the Python operator nor torch's matmuls
        assert not ops & {"wedlm::onednn_linear", "aten::linear", "aten::mm", "aten::addmm"}
    # `ar` at batch 1 runs the one-query graph of one token and one logit row: the C++ one-row
    # matmuls on the column panels (`few_rows_mm`, where oneDNN runs) and the C++ one-query attention,
    # which the graph calls as C functions (`native.C_SHIMS`)
    compiled.add_request(list(range(5, 25)), SamplingParams(temperature=0.0, max_tokens=6, decoding="ar",
                                                            ignore_eos=True))
    compiled.step()  # the prefill: a multi-query graph
    ops = _ops(lambda: [compiled.step() for _ in range(3)])
    # (the bound matmul's panels path: neither BLAS, nor oneDNN, nor the transposed copies' kernel)
    assert not ops & {"wedlm_cpu::one_row_mm", "aten::linear", "aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"}
    sources = [compiled_fx_graph(d.graph.fn).source_code for d in runner.compiled._direct]
    assert any("aoti_torch_cpu_one_query_attention(" in src for src in sources)
    while compiled.has_unfinished():
        compiled.step()
    # two sequences: a multi-row graph, whose opaque op applies the row rule at run time: the
    # prefill's 270 rows (more than FEW_ROWS_MAX) by oneDNN, then 2 rows by `few_rows_mm` on the
    # column panels (no oneDNN call)
    for p in (list(range(40, 240)), list(range(10, 80))):  # new prompts: no prefix-cache hits
        compiled.add_request(p, SamplingParams(temperature=0.0, max_tokens=6, decoding="ar", ignore_eos=True))
    assert "mkldnn::_linear_pointwise" in _ops(compiled.step)
    ops = _ops(lambda: [compiled.step() for _ in range(3)])
    assert not ops & {"mkldnn::_linear_pointwise", "aten::linear", "aten::mm", "aten::addmm"}
    while compiled.has_unfinished():
        compiled.step()
    # the panels are views into one block (`use_panel_weights`), marked static with it
    # (`plain_weights`): no guard of a graph reads a weight's size
    direct = runner.compiled._direct
    assert direct and all("_base" not in str(d.guard_manager) for d in direct)


def test_eager_inputs_are_padded_to_a_shape_bucket():
    """oneDNN keeps a primitive per input shape (resident memory grew without bound over a
    running engine's row counts): 17..24 rows all reach it as 24 rows, and no real row changes."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 32, generator=gen)
    seen = set()
    for rows in range(17, 25):
        x = torch.randn(rows, 32, generator=gen)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            got = onednn_linear(x, w)
        want = F.linear(x, w)
        assert got.shape == (rows, 64) and (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
        seen |= {tuple(e.input_shapes[0]) for e in prof.events() if e.name == "mkldnn::_linear_pointwise"}
    assert seen == {(24, 32)}


def test_the_compiled_op_is_a_cpu_kernel_without_autograd():
    """`wedlm::onednn_linear`, the compiled graph's matmul, has a kernel for the CPU key alone
    (no autograd wrapper around each call) and is `onednn_linear`'s row rule, unpadded."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("wedlm::onednn_linear", "CPU")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("wedlm::onednn_linear", "AutogradCPU")
    gen = torch.Generator().manual_seed(11)
    x, w, b = torch.randn(20, 192, generator=gen), torch.randn(384, 192, generator=gen), torch.randn(384, generator=gen)
    packed, key = pack_weight(w)  # 20 x 73,728 multiply-adds: past PACKED_MIN_MACS
    with torch.inference_mode():
        got = torch.ops.wedlm.onednn_linear(x, w, b, key)
        ops = _ops(lambda: torch.ops.wedlm.onednn_linear(x, w, b, key))
        small = torch.ops.wedlm.onednn_linear(x[:1], w, b, key)
    want = F.linear(x, w, b)
    assert got.shape == (20, 384) and (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert "mkldnn::_linear_pointwise" in ops
    assert torch.equal(small, F.linear(x[:1], w, b))  # one row: F.linear


def _decoder_tokens(llm, prompts, max_tokens):
    """Greedy token ids of every decoder, the prompts batched and each alone."""
    out = []
    for decoding in DECODERS:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, decoding=decoding, ignore_eos=True)
        out.append([o["token_ids"] for o in llm.generate(prompts, params)])
        out.append([llm.generate([p], params)[0]["token_ids"] for p in prompts])
    return out


@pytest.mark.slow
def test_shipped_model_compiled_onednn_equals_eager(monkeypatch):
    """The shipped model's compiled forward (oneDNN matmuls through `wedlm::onednn_linear`)
    gives the eager forward's tokens under every decoder, at batch 1 and 2."""
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "onednn")
    eager = LLM(str(SHIPPED), device="cpu", enable_prefix_caching=False)
    compiled = LLM(str(SHIPPED), device="cpu", enable_prefix_caching=False, enforce_eager=False)
    prompts = [[(3 * j) % 200 + 10 for j in range(24)], eager.tokenizer.encode("Count from 12 to 40.")]
    want = _decoder_tokens(eager, prompts, 40)
    assert _decoder_tokens(compiled, prompts, 40) == want
    assert all(len(ids) == 40 for group in want for ids in group)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_random_configs_compiled_onednn_equals_eager(ckpt_factory, monkeypatch, family):
    """Random models wide enough for oneDNN (gate/up of 16 rows past PACKED_MIN_MACS; qwen2's
    q/k/v biases go through the op too): compiled tokens equal eager ones."""
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "onednn")
    path = ckpt_factory(f"onednn_{family}", family=family, wedlm=True, seed=7, hidden_size=128,
                        intermediate_size=384, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    eager = LLM(str(path), device="cpu", wedlm_window_size=16, enable_prefix_caching=False)
    compiled = LLM(str(path), device="cpu", wedlm_window_size=16, enable_prefix_caching=False, enforce_eager=False)
    prompts = [list(range(5, 29)), list(range(40, 47))]
    assert _decoder_tokens(compiled, prompts, 24) == _decoder_tokens(eager, prompts, 24)
