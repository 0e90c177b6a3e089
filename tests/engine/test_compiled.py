"""The compiled forward (`enforce_eager=False`) gives the eager reference's tokens
(docs/invariants.md, "Fast paths agree with their reference").

Greedy tokens of all four decoders, run together in one continuous batch (so the steps
cover prefill, mixed batches and the batch shrinking to one), must be identical eager and
compiled. Compiling on one busy CPU thread costs tens of seconds per graph, so the default
run has one such test on a short budget; the longer per-decoder runs are `slow`.
"""

import pytest

from wedlm import LLM, SamplingParams
from wedlm.engine.defaults import DECODERS

PROMPTS = [[5, 9, 14, 3 + i] for i in range(len(DECODERS))]


def generate(llm, max_tokens):
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens + 3 * i, decoding=d, ignore_eos=True)
              for i, d in enumerate(DECODERS)]
    return [o["token_ids"] for o in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def compiled_llm(tiny_path):
    import torch

    # graphs compiled earlier in this process for the same model and shapes would be reused,
    # and the graph count below would read 0
    torch._dynamo.reset()
    return LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", enforce_eager=False)


def test_all_decoders_same_tokens_eager_and_compiled(make_llm, compiled_llm):
    eager = generate(make_llm(), 10)
    compiled = generate(compiled_llm, 10)
    assert compiled == eager
    assert all(len(ids) == 10 + 3 * i for i, ids in enumerate(eager))
    # AR steps alone, at batch 1 and 2: one query per sequence (batch and queries keep a bucket of 1)
    ar = SamplingParams(temperature=0.0, max_tokens=6, decoding="ar", ignore_eos=True)
    for prompts in (PROMPTS[:1], PROMPTS[:2]):
        assert ([o["token_ids"] for o in compiled_llm.generate(prompts, ar)]
                == [o["token_ids"] for o in make_llm().generate(prompts, ar)])
    runner = compiled_llm.engine.runner
    # buckets: one graph per (batch 1 or more) x (one query per sequence or more), never one per step
    assert runner.compiled is not None and runner.compiled.graphs == 4
    assert not compiled_llm.engine.enforce_eager
    # the test suite's default (WEDLM_ENFORCE_EAGER=1, tests/conftest.py) is eager
    assert make_llm().engine.runner.compiled is None and make_llm().engine.enforce_eager


def test_known_steps_call_their_graph_without_dynamo(make_llm, compiled_llm):
    """Once a graph has run through dynamo, a step that passes its cache entry's guards calls it
    directly (`_DirectCall`): one direct entry per graph, the eager tokens, no call through dynamo."""
    compiled = compiled_llm.engine.runner.compiled
    generate(compiled_llm, 10)  # every step shape of the run below has run before
    through = []
    dynamo = compiled._compiled
    compiled._compiled = lambda *args: through.append(args) or dynamo(*args)
    try:
        assert generate(compiled_llm, 10) == generate(make_llm(), 10)
    finally:
        compiled._compiled = dynamo
    assert through == []
    assert len(compiled._direct) == compiled.graphs == 4


def test_direct_calls_run_the_generated_code(compiled_llm):
    """A direct call runs the graph's generated code itself (`_generated_call`), without
    AOTAutograd's runtime wrappers, once it gave the wrapped call's outputs; a count of inputs
    other than the graph's finds no code, and outputs that differ keep the wrapped call."""
    import torch

    from wedlm.engine.compiled import _generated_call

    compiled = compiled_llm.engine.runner.compiled
    generate(compiled_llm, 10)
    assert compiled._direct and len(compiled._direct) == compiled.graphs
    for direct in compiled._direct:
        n = len(direct.graph.graph_args)
        assert direct.call is _generated_call(direct.graph.fn, n) is not None
        assert _generated_call(direct.graph.fn, n + 1) is None
    frames = []
    original = compiled._learn
    compiled._learn = lambda frame, logits, argmax: frames.append((frame, logits, argmax))
    kept, compiled._direct = compiled._direct, []
    try:
        generate(compiled_llm, 2)  # through dynamo now: the frames and outputs of its graphs
    finally:
        compiled._learn, compiled._direct = original, kept
    frame, logits, argmax = frames[-1]
    with torch.inference_mode():  # the guards check grad mode too
        direct = next(d for d in kept if d.guard_manager.check(frame))
        assert direct.call_generated_code(frame, (logits, argmax))
        wrong = logits.clone()
        wrong[0, 0] += 1
        before = direct.call
        direct.call = lambda args: direct.graph.fn(*args)
        assert not direct.call_generated_code(frame, (wrong, argmax))
        assert direct.call is not before
        assert direct.call_generated_code(frame, (logits, argmax)) and direct.call is before


def test_guards_read_the_call_not_the_modules(compiled_llm):
    """An engine's graphs keep dynamo's guards on the call's inputs and the global state, and
    none on the model's modules, the KV cache's tensors, module globals or the metadata object's
    own attributes shadowing its methods (`_guards_kept`)."""
    compiled = compiled_llm.engine.runner.compiled
    generate(compiled_llm, 4)
    assert compiled._direct
    for direct in compiled._direct:
        guards = str(direct.guard_manager)
        assert "L['input_ids']" in guards and "GLOBAL_STATE" in guards
        assert "G['" not in guards and "kv_cache" not in guards and "_modules" not in guards
        # the metadata object's own dict is not searched for its class's method names
        assert "TYPE_MATCH: ___check_type_id(L['attn']" in guards and "___dict_contains" not in guards


def test_matmul_weights_are_no_graph_inputs(compiled_llm):
    """With column panels every matmul is bound to a key (`fast_model.bind_linears`): the graphs
    take no weight, bias or panels of a matmul as inputs, only the norms', the embedding's and
    the step's tensors; they call the engine's C++ operators as C functions (`native.C_SHIMS`), not
    through the dispatcher."""
    from wedlm.engine.compiled import compiled_fx_graph

    runner = compiled_llm.engine.runner
    generate(compiled_llm, 4)
    assert runner.panel_weights and runner.compiled._direct
    sources = []
    for direct in runner.compiled._direct:
        names = [arg.source.name for arg in direct.graph.graph_args]
        assert any("embed_tokens" in n for n in names) and any("layernorm" in n for n in names)
        assert not any(part in n for n in names for part in ("panels", "qkv_", "gate_up", "proj", "lm_head"))
        sources.append(compiled_fx_graph(direct.graph.fn).source_code)
    layers = runner.model.config.num_hidden_layers
    assert all(src.count("aoti_torch_cpu_bound_linear(") == 1 + 4 * layers + 1 for src in sources)
    assert sum("aoti_torch_cpu_window_attention(" in src for src in sources) >= 1
    assert sum("aoti_torch_cpu_one_query_attention(" in src for src in sources) >= 1
    assert all(src.count("aoti_torch_cpu_row_argmax(") == 2 for src in sources)
    assert not any('aoti_torch_call_dispatcher("wedlm_cpu::' in src for src in sources)


def test_graphs_with_c_shims_stay_cacheable(compiled_llm):
    """The C-shim option (`native.c_shims`) pickles as the operators' names, so inductor's compile
    cache keys it and a second process loads the graphs instead of compiling them again (an
    operator overload in the option made every graph bypass the cache)."""
    import pickle

    from torch._dynamo.utils import counters

    from wedlm.engine import native

    shims = native.c_shims()
    assert shims and pickle.loads(pickle.dumps(shims)) == shims
    generate(compiled_llm, 4)
    assert compiled_llm.engine.runner.compiled.graphs and not counters["inductor"]["fxgraph_cache_bypass"]


def test_direct_call_reads_plain_sources_only():
    """`_DirectCall.of` rebuilds a graph's inputs from their dynamo sources: the model's and the KV
    cache's once, the step's at each call; any other kind of source keeps dynamo."""
    from types import SimpleNamespace as NS

    import torch

    from wedlm.engine.compiled import _DirectCall

    def graph(*names, fn=lambda *args: list(args)):
        return NS(fn=fn, graph_args=[NS(source=NS(name=n), pass_arg_as_tensor=False) for n in names])

    weight, ids = torch.ones(2), torch.arange(5)
    frame = {"model": NS(w=weight), "input_ids": ids, "attn": NS(kv_cache=NS(k=[torch.zeros(1)]))}
    direct = _DirectCall.of(None, graph("L['input_ids'].size()[0]", "L['model'].w", "L['input_ids']",
                                        "L['attn'].kv_cache.k[0]"), frame)
    assert direct.static == (weight, frame["attn"].kv_cache.k[0])
    other = torch.arange(7)
    got = direct({"model": NS(w=torch.zeros(2)), "input_ids": other, "attn": None})
    assert got[0] == 7 and got[1] is weight and got[2] is other and got[3] is frame["attn"].kv_cache.k[0]
    # a graph with the C++ wrapper takes its int inputs as tensors: shared ones, made once
    ints = _DirectCall.of(None, graph("L['input_ids'].size()[0]", "L['input_ids']"), frame, int_tensors=True)
    first, second = ints(frame), ints({**frame, "input_ids": other})
    assert first[0].dtype == torch.int64 and first[0].dim() == 0 and first[0].item() == 5
    assert second[0].item() == 7 and ints(frame)[0] is first[0] and second[1] is other
    assert _DirectCall.of(None, graph("G['table']"), frame) is None
    assert _DirectCall.of(None, graph("___as_tensor(L['input_ids'])"), frame) is None
    tensor_arg = graph("L['input_ids']")
    tensor_arg.graph_args[0].pass_arg_as_tensor = True
    assert _DirectCall.of(None, tensor_arg, frame) is None


@pytest.mark.slow
@pytest.mark.parametrize("decoding", DECODERS)
def test_each_decoder_alone_same_tokens(make_llm, compiled_llm, decoding):
    params = SamplingParams(temperature=0.0, max_tokens=40, decoding=decoding, ignore_eos=True)
    prompts = [[7, 1, 4], [2, 8, 8, 8, 3, 9, 30]]
    eager = [o["token_ids"] for o in make_llm().generate(prompts, params)]
    assert [o["token_ids"] for o in compiled_llm.generate(prompts, params)] == eager
    assert [compiled_llm.generate([p], params)[0]["token_ids"] for p in prompts] == eager


def test_enforce_eager_must_be_bool_or_none(tiny_path):
    with pytest.raises(ValueError, match="enforce_eager must be None \\(automatic\\), True or False, got 'no'"):
        LLM(str(tiny_path), device="cpu", enforce_eager="no")


def test_automatic_enforce_eager(monkeypatch):
    """None compiles exactly where inductor has its toolchain; WEDLM_ENFORCE_EAGER overrides the
    automatic choice, an explicit value overrides both, a bad variable is named."""
    import torch

    from wedlm.engine import config

    cpu = torch.device("cpu")
    monkeypatch.delenv("WEDLM_ENFORCE_EAGER", raising=False)
    monkeypatch.setattr(config, "compile_toolchain", lambda kind: (kind == "cpu", f"{kind} toolchain"))
    assert config.resolve_enforce_eager(None, cpu) == (False, "auto: cpu toolchain")
    assert config.resolve_enforce_eager(None, torch.device("cuda")) == (True, "auto: cuda toolchain")
    assert config.resolve_enforce_eager(True, cpu) == (True, "requested")
    monkeypatch.setenv("WEDLM_ENFORCE_EAGER", "1")
    assert config.resolve_enforce_eager(None, cpu) == (True, "WEDLM_ENFORCE_EAGER=1")
    assert config.resolve_enforce_eager(False, cpu) == (False, "requested")
    monkeypatch.setenv("WEDLM_ENFORCE_EAGER", "yes")
    with pytest.raises(ValueError, match="WEDLM_ENFORCE_EAGER must be '0' or '1', got 'yes'"):
        config.resolve_enforce_eager(None, cpu)


def test_compile_toolchain_of_this_machine():
    """A CPU build of torch has a C++ compiler to find here (the compiled tests need it) and no
    backend for an unknown device type."""
    import shutil

    from wedlm.hardware import compile_toolchain

    found, why = compile_toolchain("cpu")
    assert found == any(shutil.which(c) for c in ("g++", "clang++")), why
    assert compile_toolchain("mps") == (False, "no inductor backend for mps")


def test_compile_cache_dir(monkeypatch, tmp_path):
    """TORCHINDUCTOR_CACHE_DIR wins; else the engine's cache folder, one per version of the C++
    operators' sources (a cached graph calls them with their schema of then), exported to torch."""
    from wedlm.engine import native
    from wedlm.engine.compiled import compile_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("WEDLM_CACHE", str(tmp_path / "wedlm"))
    ours = tmp_path / "wedlm" / "torch-compile" / native.sources_digest()[:12]
    assert compile_cache_dir() == ours
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(ours)
    # importing dynamo exports torch's own default (a folder under /tmp): that is not a choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert compile_cache_dir() == ours


def test_plain_weights_are_static_and_settings_are_restored(compiled_llm):
    """The fused weights (plain tensors, not parameters) are marked static, so their sizes add
    no shape guards; the compiler settings the compiled forward runs under are the process's
    own again after every call, including one that raises."""
    import torch
    from torch.fx.experimental import _config as fx_config

    from wedlm.engine.compiled import _CompileSettings
    from wedlm.engine.fast_model import plain_weights

    model = compiled_llm.engine.runner.model
    weights = plain_weights(model)
    # 2 per layer (qkv, gate_up; the tiny model has no q/k/v bias), and one copy for the one-row
    # matmuls, 4 per layer (qkv, o_proj, gate_up, down_proj) and lm_head's: the transposed weight,
    # or its column panels where the C++ operators run (`use_panel_weights` drops the transposed
    # copy), with the one block of memory the panels are views into
    block = 1 if compiled_llm.engine.runner.panel_weights else 0
    assert len(weights) == 2 * model.config.num_hidden_layers + 4 * model.config.num_hidden_layers + 1 + block
    copies = [w for m in model.modules() for w in weights
              if any(w is getattr(m, name, None) for name in ("weight_t", "weight_panels"))]
    assert len(copies) == 4 * model.config.num_hidden_layers + 1
    assert all(w._dynamo_static_indices == set(range(w.dim())) for w in weights)
    before = (fx_config.use_duck_shape, torch._dynamo.config.specialize_float)
    with pytest.raises(RuntimeError, match="inside"):
        with _CompileSettings():
            assert (fx_config.use_duck_shape, torch._dynamo.config.specialize_float) == (False, True)
            raise RuntimeError("inside")
    assert (fx_config.use_duck_shape, torch._dynamo.config.specialize_float) == before


def test_settings_apply_to_the_engines_compiles_alone(tiny_path):
    """`_CompileSettings` are set by dynamo's compile callbacks while an engine's forward compiles,
    never while another function compiles nor while a compiled graph runs."""
    import torch
    from torch._dynamo.callback import callback_handler
    from torch.fx.experimental import _config as fx_config

    from wedlm import LLM, SamplingParams
    from wedlm.engine.compiled import CompiledForward

    seen = []

    def settings():
        return fx_config.use_duck_shape, torch._dynamo.config.specialize_float

    graph_calls = []
    original = CompiledForward.__call__

    def call(self, *args):
        graph_calls.append(settings())
        return original(self, *args)

    default = settings()
    torch._dynamo.reset()  # clears every compile callback
    # an end callback registered before the engine's: it runs before the engine's restores the settings
    callback_handler.register_end_callback(lambda _: seen.append(settings()))
    try:
        torch.compile(lambda x: x * 2 + 1, dynamic=True)(torch.ones(3))  # not the engine's: torch's own
        assert seen == [default]
        llm = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", enforce_eager=False)
        CompiledForward.__call__ = call
        params = SamplingParams(temperature=0.0, max_tokens=4, decoding="ar", ignore_eos=True)
        llm.generate([[7, 1, 4]], params)
        assert seen[1:] == [(False, True)] * llm.engine.runner.compiled.graphs  # every engine compile
        assert llm.engine.runner.compiled.graphs == 2  # the prompt's step and the one-token steps
        assert graph_calls == [default] * 4 and settings() == default  # set only inside the compiles
    finally:
        CompiledForward.__call__ = original
        torch._dynamo.reset()


def test_each_engine_compiles_its_own_copy():
    """Guards on the model's modules are dropped, so no two engines may share a code object
    (and with it dynamo's cache of graphs): each CompiledForward compiles its own copy."""
    import torch

    from wedlm.engine.compiled import CompiledForward, _own_copy, forward_logits

    first, second = _own_copy(forward_logits), _own_copy(forward_logits)
    assert first.__code__ is not second.__code__ and first.__code__ != second.__code__
    assert first.__code__.co_code == forward_logits.__code__.co_code
    assert first.__name__.startswith("forward_logits_") and first.__defaults__ == forward_logits.__defaults__
    a, b = CompiledForward(torch.device("cpu"), []), CompiledForward(torch.device("cpu"), [])
    assert a._compiled._torchdynamo_orig_callable.__code__ is not b._compiled._torchdynamo_orig_callable.__code__


@pytest.mark.slow
def test_two_compiled_engines_keep_their_own_models(ckpt_factory, monkeypatch):
    """Two models of one shape, compiled in one process (oneDNN: each graph holds its own
    engine's packed-weight keys): each engine gives its own eager tokens."""
    monkeypatch.setenv("WEDLM_CPU_LINEAR", "onednn")
    paths = [ckpt_factory(f"own_copy_{seed}", family="qwen3", wedlm=True, seed=seed, hidden_size=128,
                          intermediate_size=384, head_dim=32) for seed in (21, 22)]
    params = [SamplingParams(temperature=0.0, max_tokens=16, decoding=d, ignore_eos=True) for d in ("ar", "wedlm")]
    prompts = [list(range(5, 29)), list(range(40, 47))]
    want, got = [], []
    for path in paths:
        eager = LLM(str(path), device="cpu", wedlm_window_size=16, enable_prefix_caching=False)
        want.append([o["token_ids"] for p in params for o in eager.generate(prompts, p)])
    engines = [LLM(str(path), device="cpu", wedlm_window_size=16, enable_prefix_caching=False, enforce_eager=False)
               for path in paths]
    for llm in engines + engines[::-1]:  # each engine after the other's graphs exist
        got.append([o["token_ids"] for p in params for o in llm.generate(prompts, p)])
    assert want[0] != want[1]
    assert got == [want[0], want[1], want[1], want[0]]


def one_call_and_numpy_build(runner, item):
    """`runner.prepare([item])` from the C++ call and from the numpy build, after checking that
    they hold the same tensors (values, dtypes, which are None)."""
    import torch

    got = runner.prepare([item])
    runner.one_call_inputs = False
    try:
        want = runner.prepare([item])
    finally:
        runner.one_call_inputs = True
    assert got.num_rows == want.num_rows
    for name in ("input_ids", "positions", "logit_rows"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b), name
    for name in ("slot_mapping", "kv_slots", "q_index", "t_index", "mask", "key_ends"):
        a, b = getattr(got.attn, name), getattr(want.attn, name)
        assert (a is None) == (b is None) and (a is None or (a.dtype == b.dtype and torch.equal(a, b))), name
    return got, want


def test_one_sequences_inputs_in_one_call_are_the_numpy_builds(compiled_llm):
    """A window step of one sequence takes its inputs from one C++ call (`_prepare_one`): the
    same tensors, shapes and dtypes as the numpy build (`PagedAttention.build`) for any context,
    window, block table and logit rows, padded tokens and rows included."""
    import random

    from wedlm.engine.runner import ForwardItem

    runner = compiled_llm.engine.runner
    assert runner.one_call_inputs
    calls = []
    one = runner._prepare_one
    runner._prepare_one = lambda *args: calls.append(1) or one(*args)
    rng = random.Random(3)
    bs = runner.kv_cache.block_size
    for _ in range(60):
        n, ctx = rng.randint(2, 40), rng.choice([0, 1, 5, 63, 64, 200])
        table = rng.sample(range(runner.pad_slot // bs), -(-(ctx + n) // bs) + rng.randint(0, 2))
        item = ForwardItem([rng.randrange(100) for _ in range(n)], [ctx + j for j in rng.sample(range(n), n)], table,
                           ctx, sorted(rng.sample(range(n), rng.randint(0, n))))
        got, want = one_call_and_numpy_build(runner, item)
        assert want.attn.q_index is None and want.attn.mask is None
    del runner._prepare_one
    assert len(calls) == 60


def test_one_tokens_inputs_in_one_call_are_the_numpy_builds(compiled_llm):
    """A one-token step of one sequence (batch-1 `ar`) takes its inputs from the same C++ call,
    unpadded and without prefix lengths: the numpy build's tensors, exactly its keys and no
    visibility (the one-query kernel reads every key given), with or without its logit row."""
    import random

    from wedlm.engine.runner import ForwardItem

    runner = compiled_llm.engine.runner
    calls = []
    one = runner._prepare_one
    runner._prepare_one = lambda *args: calls.append(args[-1]) or one(*args)
    rng = random.Random(5)
    bs = runner.kv_cache.block_size
    try:
        for ctx in [0, 1, 5, 62, 63, 64, 65, 200] + [rng.randrange(400) for _ in range(22)]:
            table = rng.sample(range(runner.pad_slot // bs), -(-(ctx + 1) // bs) + rng.randint(0, 2))
            rows = [0] if ctx % 7 else []
            item = ForwardItem([rng.randrange(100)], [ctx], table, ctx, rows)
            got, want = one_call_and_numpy_build(runner, item)
            assert got.num_rows == len(rows) and tuple(got.attn.kv_slots.shape) == (1, ctx + 1)
            assert got.attn.mask is None and got.attn.key_ends is None
        assert calls == [True] * 30
    finally:
        del runner._prepare_one


def test_batch1_one_query_step_on_a_cpu_has_exact_keys_and_no_mask(compiled_llm):
    """A compiled CPU step of one token of one sequence pads nothing: its keys are exactly the
    cached rows plus the new one (no multiple of 64) and it carries no mask, as eager mode; a
    window step keeps its causal mask (as prefix lengths for the C++ kernel), and its token
    buckets unless the C++ kernels take any count."""
    from wedlm.engine.runner import ForwardItem

    runner = compiled_llm.engine.runner
    one = ForwardItem([7], [70], list(range(20)), context_len=70, logit_rows=[0])
    prepared = runner.prepare([one])
    assert prepared.attn.mask is None and prepared.attn.q_index is None
    assert tuple(prepared.attn.kv_slots.shape) == (1, 71) and prepared.attn.kv_slots.stride() == (71, 1)
    assert prepared.attn.kv_slots.tolist() == [list(range(71))]
    assert prepared.input_ids.tolist() == [7] and prepared.logit_rows.tolist() == [0]
    window = ForwardItem([7, 3, 3], [70, 71, 72], list(range(20)), context_len=70, logit_rows=[0, 1, 2])
    padded = runner.prepare([window])
    # keys in buckets of 64 and tokens in buckets (4), or exactly the 73 keys and 3 tokens where
    # the C++ kernels take any count (`StepShape.of`)
    keys, tokens = (73, 3) if runner.panel_weights else (128, 4)
    assert tuple(padded.attn.kv_slots.shape) == (1, keys)
    if runner.key_ends:
        assert padded.attn.mask is None and padded.attn.key_ends.tolist() == [[71, 72, 73, keys][:tokens]]
    else:
        assert padded.attn.mask is not None and padded.attn.key_ends is None
    # a chunk that asks no logits runs the same graph, its logit rows all padding
    chunk = runner.prepare([ForwardItem([7, 3, 3], [70, 71, 72], list(range(20)), context_len=70, logit_rows=[])])
    assert chunk.num_rows == 0 and chunk.logit_rows.tolist() == [0, 0]
    assert (chunk.attn.key_ends is not None) == runner.key_ends == (chunk.attn.mask is None)
    assert padded.input_ids.shape[0] == tokens


def test_one_sequences_logits_are_the_same_with_its_tokens_unpadded(compiled_llm, monkeypatch):
    """Where the C++ kernels take any count, a window of one sequence runs its tokens as they are
    (`StepShape.of(..., exact=True)`): every real row's logits equal, bit for bit, those of the
    same window padded to its token bucket, since each row is computed alone in those kernels."""
    import torch
    from engine_test_util import window_logits_unpadded_and_padded

    runner = compiled_llm.engine.runner
    if not runner.panel_weights:
        pytest.skip("the engine's C++ operators did not load: tokens stay in buckets")
    for n, ctx in [(3, 70), (5, 0), (6, 33), (12, 90)]:
        got, want = window_logits_unpadded_and_padded(runner, monkeypatch, n, ctx)
        assert got.shape == want.shape == (n - 1, got.shape[1]) and torch.equal(got, want)


def test_warm_up_compiles_every_graph_the_requests_then_use(tiny_path, make_llm):
    """`LLM.warm_up` (what `wedlm serve` runs before it opens its port) compiles the four graphs of
    a compiled CPU engine; no later request of any decoder, batch, window or prompt length compiles
    another. It leaves no KV block held. An eager engine has nothing to warm up."""
    llm = LLM(str(tiny_path), device="cpu", enforce_eager=False)
    compiled = llm.engine.runner.compiled
    assert compiled.graphs == 0
    assert llm.warm_up() > 0
    assert compiled.graphs == 4
    assert not llm.has_unfinished() and llm.metrics()["kv_blocks_used"] == 0
    for decoding in ("wedlm", "verified", "blockwise", "ar"):
        params = SamplingParams(temperature=0.0, max_tokens=12, decoding=decoding, ignore_eos=True, logprobs=2)
        for prompts in (PROMPTS[:1], PROMPTS, [list(range(5, 120))]):
            assert all(not o.get("error") and len(o["token_ids"]) == 12 for o in llm.generate(prompts, params))
    assert compiled.graphs == 4
    request = llm.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4))
    with pytest.raises(RuntimeError, match="warm_up\\(\\) needs an idle engine: requests are unfinished"):
        llm.warm_up()
    llm.abort(request)
    assert make_llm().warm_up() == 0.0
