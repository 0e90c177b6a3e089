"""The step's forward as one function, run eagerly (the reference) or `torch.compile`d.

`forward_logits` is everything a decode step asks of the model: hidden states of
all fed tokens (K/V written into the paged cache), logits at the asked rows in
float32, the [MASK] column banned, the greedy ids. `CompiledForward` is the
same function under `torch.compile` (inductor; on CPU C++/OpenMP kernels, on
CUDA Triton kernels plus CUDA graphs for decode-sized steps; on CPU the graph's calling
code is C++ too, inductor's `cpp_wrapper`), called with
inputs padded to shape buckets (`buckets.py`) so a new step rarely means a new
compile. `enforce_eager=True` (the engine option) runs `forward_logits`
directly; `tests/engine/test_compiled.py` checks that both give the same tokens.

Compiled graphs persist on disk (torch's FX graph and AOTAutograd caches, on by default in
torch) under `compile_cache_dir()`: a second process with the same model, shapes and torch
build loads the generated kernels instead of generating and building them again.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import threading
import time
import types
import weakref
from pathlib import Path

import torch
from torch._dynamo.callback import CallbackArgs, CallbackTrigger, callback_handler, on_compile_end, on_compile_start
from torch.fx.experimental import _config as fx_config

from ..model import PagedAttention, QwenForCausalLM
from ..model.source import cache_dir
from .fast_model import row_argmax

log = logging.getLogger("wedlm.engine")

# Steps with at most this many (padded) tokens run as CUDA graphs; larger ones (prefill) compiled only.
CUDA_GRAPH_MAX_TOKENS = 512
# torch.compile keeps at most `recompile_limit` graphs per code object (8 by default) and then runs
# the function uncompiled with only a warning. Each engine's CompiledForward compiles its own copy
# of `forward_logits` (`_own_copy`), up to four graphs per model (buckets.py); the limit is raised
# to at least this, process-wide, so that a rarer step shape still compiles instead of silently
# running eager.
RECOMPILE_LIMIT = 64
# dynamo's cache entries of a code object (each with its guards), in the order dynamo tries them;
# None where this torch has no such function (then every call goes through dynamo)
_cache_entries = getattr(torch._C._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
_COPIES = itertools.count()


def forward_logits(model: QwenForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
                   attn: PagedAttention, logit_rows: torch.Tensor, mask_token_id: int | None,
                   autocast: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One paged forward: K/V of every token into the cache, logits at `logit_rows`.

    Args:
        input_ids, positions: int64 [num_tokens] (logical positions, any order).
        attn: the paged-attention metadata of the step.
        logit_rows: int64 [num_rows] indices into the token axis.
        mask_token_id: this column is set to -inf in every row ([MASK] is never an output).
        autocast: run the model under `torch.autocast(dtype=autocast)` (bf16 on a CPU with
            bf16 matrix units); None = the weights' dtype.

    Returns:
        (float32 logits [num_rows, vocab], int64 argmax [num_rows]).
    """
    if autocast is None:
        # no autocast region at all, not a disabled one: a traced autocast region (even disabled)
        # is a graph node AOTAutograd's persistent cache refuses, so a warm process re-traced it
        logits = model(input_ids, positions, attn, logit_rows)
    else:
        with torch.autocast(input_ids.device.type, dtype=autocast):
            logits = model(input_ids, positions, attn, logit_rows)
    logits = logits.float()
    if mask_token_id is not None:
        # index_fill_, not `logits[:, id] = -inf`: inductor lowers that assignment to a pass that
        # rewrites every logit (~30 us for 16 x 4096 on one core), index_fill_ to one store a row
        logits.index_fill_(1, torch.tensor([mask_token_id], device=logits.device), float("-inf"))
    return logits, row_argmax(logits)


def compile_cache_dir() -> Path:
    """Where compiled graphs are cached across processes: `$TORCHINDUCTOR_CACHE_DIR` when set
    (torch's own variable), else `cache_dir()/torch-compile/<digest>` (~/.cache/wedlm/torch-compile/…,
    or under `$WEDLM_CACHE`), one folder per version of the engine's C++ operators
    (`native.sources_digest`). Sets TORCHINDUCTOR_CACHE_DIR to it for this process when unset,
    the one place torch reads it (torch's default is a folder under /tmp, lost on reboot).

    A cached graph calls the C++ operators with the arguments of their schema when it was built,
    and torch's cache keys do not cover a custom operator's schema: a graph built before an
    operator gained an argument would call it with one argument short (a crash, not an error).
    A folder set in TORCHINDUCTOR_CACHE_DIR is the user's: clear it when the operators change.

    Importing torch's dynamo exports torch's default folder into the variable itself, so a
    value equal to that default counts as unset.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "torch-compile" / _operators_digest())
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


@functools.lru_cache(maxsize=1)
def _operators_digest() -> str:
    from .native import sources_digest

    return sources_digest()[:12]


class CompiledForward:
    """`forward_logits` under `torch.compile`, with the same signature.

    Compilation is lazy: the first call of each new graph compiles (seconds to a
    minute; much less when `compile_cache_dir()`, `cache_dir`, holds it from an earlier process);
    `graphs` and `compile_s` count them and each is logged once. Inputs
    must already be padded to shape buckets (the runner does it). On CUDA, steps of
    at most `CUDA_GRAPH_MAX_TOKENS` padded tokens replay CUDA graphs (one per bucket
    shape); the KV cache tensors are marked as static addresses so the graphs may
    write into them.

    Args:
        device: the model's device.
        kv_tensors: every K and V cache tensor (marked static on CUDA).
        collectives: the model is one tensor-parallel rank's shard (its forward holds
            all-reduces): on a CPU the graph keeps inductor's Python calling code, since its
            C++ wrapper cannot call collectives.
        weights: the model's weight tensors that are not parameters (the fused q/k/v and
            gate/up weights, precast copies: `fast_model.plain_weights`), marked static: a
            plain tensor attribute is otherwise a dynamic input, whose sizes and strides add
            symbolic shape guards to every call.
    """

    def __init__(self, device: torch.device, kv_tensors: list[torch.Tensor], collectives: bool = False,
                 weights: list[torch.Tensor] = ()) -> None:
        self.graphs = 0
        self.compile_s = 0.0
        self.cache_dir = compile_cache_dir()
        dynamo_config = torch._dynamo.config
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        # On a CPU the graph's calling code is generated as C++ (inductor's `cpp_wrapper`): a
        # one-token step of the shipped model spends ~0.2 ms in the Python wrapper otherwise
        # (docs/engine.md, "Compiled forward" and docs/experiments.md, "C++ wrapper"); compiling a graph takes longer instead.
        # Its size asserts (each input's and each C++ operator's output's sizes and strides checked
        # on every call, ~130 checks a step) are off: dynamo's guards check the step's inputs, the
        # model's and KV cache's tensors never change in an engine, and `test_native.py` checks
        # each operator's output against its registered shape function (`torch.library.opcheck`).
        # A batch-1 `wedlm` answer took 0.96x the time without them (same tokens). The calling code
        # is built apart from the kernels (`cpp_wrapper_build_separate`: the wrapper at -O1, the
        # kernels at -O3): SmolLM2-135M's first graphs took 128 s with an empty cache, 87 s of it
        # gcc on one -O3 file holding 30 layers' calls and kernels; 67 s apart (the shipped model's
        # first answer 19.3 against 22.2 s), steps within noise (15.4 against 15.0 ms a token).
        options = ({"cpp_wrapper": True, "size_asserts": False} if device.type == "cpu" and not collectives
                   else {})
        from torch._inductor import config as inductor_config

        if options and hasattr(inductor_config, "cpp_wrapper_build_separate"):  # older torch has no such option
            options["cpp_wrapper_build_separate"] = True
        if options:
            from .native import c_shims

            shims = c_shims()
            if shims:  # the C++ operators' C functions, called without the dispatcher
                options["aot_inductor.custom_ops_to_c_shims"] = shims
        # Dynamo checks a graph's guards before every call; most of them re-check the model's
        # modules (their types, flags, int attributes), which an engine never changes after it
        # is built. They are dropped (`skip_guard_on_all_nn_modules_unsafe`): the batch-1 step
        # of the shipped model took 0.94-0.97x the time (docs/experiments.md, "A lighter matmul
        # operator and fewer guards"). That is safe because each engine compiles its own copy
        # of `forward_logits` (`_own_copy`: its own code object, so its own dynamo cache), whose
        # graphs only ever see this engine's model. For the same reason the guards on the KV
        # cache's tensors go too (`_guards_kept`): the runner passes its one KV cache every call.
        # A CPU step calls its graph directly once dynamo has compiled it (`_DirectCall`): dynamo's
        # frame, its bytecode fetching ~130 tensors and the graph's call wrappers cost ~0.25 ms a
        # step, a tenth of a 16-slot step of the shipped model and a quarter of a one-token one.
        self._direct: list[_DirectCall] | None = [] if device.type == "cpu" and _cache_entries else None
        self._ran: list[tuple[_Graph, list]] = []
        self._options = options
        backend = self._compile_graph if self._direct is not None else "inductor"
        self._compiled = torch.compile(_own_copy(forward_logits), dynamic=True, backend=backend,
                                       options={**(options if backend == "inductor" else {}), "guard_filter_fn": _guards_kept})
        self._graphed = None
        for t in [*kv_tensors, *weights]:  # fixed shapes: no symbolic sizes to collide with the step's sizes
            torch._dynamo.mark_static(t)
        if device.type == "cuda":
            for t in kv_tensors:
                torch._dynamo.mark_static_address(t)
            self._graphed = torch.compile(_own_copy(forward_logits), dynamic=True, mode="reduce-overhead")

    def __call__(self, model, input_ids, positions, attn, logit_rows, mask_token_id, autocast):
        graphed = self._graphed is not None and input_ids.shape[0] <= CUDA_GRAPH_MAX_TOKENS
        fn = self._graphed if graphed else self._compiled
        self._graph_kind = "CUDA graph" if graphed else "inductor"
        self._tokens = input_ids.shape[0]
        if _compile_started not in callback_handler.start_callbacks:  # `torch._dynamo.reset()` drops them
            on_compile_start(_compile_started)
            on_compile_end(_compile_ended)
        if self._direct is not None:
            frame = {"model": model, "input_ids": input_ids, "positions": positions, "attn": attn,
                     "logit_rows": logit_rows, "mask_token_id": mask_token_id, "autocast": autocast}
            for direct in self._direct:
                if direct.guard_manager.check(frame):
                    out = direct(frame)
                    return out[0], out[1]
        _CALLING.forward = self  # a compile this call starts gets the engine's settings (`_compile_started`)
        self._ran.clear()
        try:
            logits, argmax = fn(model, input_ids, positions, attn, logit_rows, mask_token_id, autocast)
        finally:
            _CALLING.forward = None
        if self._direct is not None:
            self._learn(frame, logits, argmax)
        if graphed:  # a CUDA graph's outputs are overwritten by its next replay
            logits, argmax = logits.clone(), argmax.clone()
        return logits, argmax

    def _compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list) -> _Graph:
        """Dynamo's backend on a CPU: inductor (`compile_fx`, with the engine's options), its graph
        wrapped in a `_Graph` that knows where each input comes from."""
        from torch._inductor.compile_fx import compile_fx

        fn = compile_fx(gm, example_inputs, config_patches=self._options)
        return _Graph(self, fn, [node.meta.get("grapharg") for node in gm.graph.find_nodes(op="placeholder")])

    def _learn(self, frame: dict, logits: torch.Tensor, argmax: torch.Tensor) -> None:
        """After a call through dynamo: remember the cache entry whose guards `frame` passes and
        the graph it ran, so that later calls passing the same guards call the graph directly.
        Only a call that ran exactly one graph and returned that graph's two outputs as they are
        qualifies (no graph break, no output or input fix-up in dynamo's bytecode)."""
        ran, self._ran = self._ran, []
        if len(ran) != 1 or len(ran[0][1]) != 2 or ran[0][1][0] is not logits or ran[0][1][1] is not argmax:
            return
        code = self._compiled._torchdynamo_orig_callable.__code__
        entry = next((e for e in _cache_entries(code) if e.guard_manager.check(frame)), None)
        if entry is not None and all(d.guard_manager is not entry.guard_manager for d in self._direct):
            direct = _DirectCall.of(entry.guard_manager, ran[0][0], frame, bool(self._options.get("cpp_wrapper")))
            if direct is not None:
                direct.call_generated_code(frame, (logits, argmax))
                self._direct.append(direct)

    def _compile_began(self) -> None:
        self._settings = _CompileSettings()
        self._settings.__enter__()
        self._compile_start = time.perf_counter()

    def _compile_done(self) -> None:
        self._settings.__exit__()
        elapsed = time.perf_counter() - self._compile_start
        self.graphs += 1
        self.compile_s += elapsed
        log.info("compiled forward: graph %d for %d tokens (%s) in %.1f s (total %.1f s)", self.graphs,
                 self._tokens, self._graph_kind, elapsed, self.compile_s)


# The CompiledForward whose call runs in this thread, if any: dynamo's compile callbacks are
# process-wide, and only a compile of an engine's forward gets `_CompileSettings`. The callbacks
# are registered by the first call (again after `torch._dynamo.reset()`, which clears them).
# Dynamo runs them around each compile (tracing, graph, kernels), never around a call that its
# guards send to a compiled graph: the settings then cost nothing per step (set and restored
# around every call they took ~9 us warm, several times that in a step's cold caches).
_CALLING = threading.local()


def _compile_started(args: CallbackArgs) -> None:
    forward = getattr(_CALLING, "forward", None)
    if forward is not None and args.callback_trigger is CallbackTrigger.DYNAMO:
        forward._compile_began()


def _compile_ended(args: CallbackArgs) -> None:
    forward = getattr(_CALLING, "forward", None)
    if forward is not None and args.callback_trigger is CallbackTrigger.DYNAMO:
        forward._compile_done()


class _CompileSettings:
    """Process-wide compiler settings, set only while dynamo compiles an engine's forward and
    restored after (`_compile_started`; set directly: `config.patch` cost 14 us a call for one
    setting, 58 for two):

    * no "duck sizing": two sizes that happen to be equal in one step must not be assumed equal;
    * float constants of the model (norm eps, attention scale) specialised as constants: else
      each is a Python lambda guard, evaluated on every call (about 200 of the shipped model's
      380 lambda guards; the guard check of its batch-1 graph took 33 us, 22 us without them
      and with `weights` static).
    """

    SETTINGS = ((fx_config, "use_duck_shape", False), (torch._dynamo.config, "specialize_float", True))

    def __enter__(self) -> None:
        self._old = [getattr(module, name) for module, name, _ in self.SETTINGS]
        for module, name, value in self.SETTINGS:
            setattr(module, name, value)

    def __exit__(self, *exc) -> None:
        for (module, name, _), old in zip(self.SETTINGS, self._old):
            setattr(module, name, old)


def _guards_kept(entries: list) -> list[bool]:
    """Dynamo's `guard_filter_fn` for an engine's forward: every guard but those on the model's
    modules (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`), on the KV cache's tensors
    (fixed sizes, marked static, the same tensors in every call of one engine: 7 guards each,
    112 of the shipped model's ~170) and on module globals (`is_global`: the functions, modules,
    constants and kernel hooks the traced code read, ~60 identity checks that cost 13-16 us of a
    step's 31-53 us guard check in cold caches). An engine's graphs are traced with the code and
    settings of their first call: a module global changed later (monkeypatching a function,
    `use_cpu_attention` with other kernels) is not seen by them, as a change to the model is not;
    a new engine traces its own copy. Nor are the checks that the metadata object's own attributes
    shadow none of its class's methods (`NOT_PRESENT_IN_GENERIC_DICT` on `attn`: eight dict lookups
    on a fresh object each step, 25 against 14 us of a guard check after the caches were swept):
    the runner builds every `PagedAttention` itself, with its fields only."""
    keep = torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries)
    # an entry's name is its source without the frame's L[...]: "attn.kv_cache.k[0]"
    return [k and not e.is_global and not e.name.startswith("attn.kv_cache")
            and not (e.guard_type == "NOT_PRESENT_IN_GENERIC_DICT" and e.name == "attn")
            for k, e in zip(keep, entries)]


class _Graph:
    """One graph compiled by a `CompiledForward`'s backend: inductor's callable `fn` (called, as
    dynamo calls it, with the graph's inputs as arguments) and each input's dynamo `GraphArg` (its
    source: where dynamo's bytecode reads it from the call's arguments). Each call through dynamo
    is reported to the owner (`_ran`, read by `_learn`)."""

    def __init__(self, owner: CompiledForward, fn, graph_args: list) -> None:
        # a weak reference: dynamo's cache (which holds this graph) lives as long as the compiled
        # function's code object, which the owner holds; a strong one would keep both alive
        self.owner, self.fn, self.graph_args = weakref.ref(owner), fn, graph_args

    def __call__(self, *args) -> list:
        out = self.fn(*args)
        owner = self.owner()
        if owner is not None:
            owner._ran.append((self, out))
        return out


class _DirectCall:
    """A `_Graph` called without dynamo, for calls that pass its cache entry's guards.

    The graph's inputs are rebuilt from the call's arguments by their dynamo sources, in one
    generated function. Inputs read from the model or the KV cache tensors are read once, when
    the call is made: an engine's model and KV cache keep their tensors for its whole life
    (dynamo's guards on the model's modules are dropped for the same reason, `CompiledForward`).
    With `int_tensors` (a graph with inductor's C++ wrapper, whose Python side turns each int
    input into a new tensor, ~5 us apiece) the int inputs (sizes, the [MASK] id) are passed as
    shared 0-dim tensors instead (`_int_tensor`).
    """

    STATIC = ("L['model']", "L['attn'].kv_cache")
    # the sources this class can evaluate: locals, attributes, indexing, sizes and strides
    SOURCE = re.compile(r"L\['\w+'\](\.\w+|\[\d+\]|\['\w+'\]|\.size\(\)\[\d+\]|\.stride\(\)\[\d+\])*")

    def __init__(self, guard_manager, graph: _Graph, build, static: tuple) -> None:
        self.guard_manager, self.graph, self.build, self.static = guard_manager, graph, build, static
        self.call = lambda args: graph.fn(*args)

    @classmethod
    def of(cls, guard_manager, graph: _Graph, frame: dict, int_tensors: bool = False) -> _DirectCall | None:
        """The direct call of `graph` for the entry of `guard_manager` (`frame`: a call that
        passed its guards), or None when one of its inputs comes from a source other than a
        plain expression of the call's arguments."""
        exprs, static = [], []
        for arg in graph.graph_args:
            name = None if arg is None or arg.pass_arg_as_tensor or arg.source is None else arg.source.name
            if name is None or not cls.SOURCE.fullmatch(name):
                return None
            value = eval(name, {"L": frame})  # noqa: S307 - a source name matched by SOURCE
            if name.startswith(cls.STATIC):
                exprs.append(f"S[{len(static)}]")
                static.append(value)
            elif int_tensors and type(value) is int:
                exprs.append(f"I({name})")
            else:
                exprs.append(name)
        build = eval(f"lambda L, S: [{', '.join(exprs)}]", {"I": _int_tensor})  # noqa: S307 - as above
        return cls(guard_manager, graph, build, tuple(static))

    def __call__(self, frame: dict) -> list:
        return self.call(self.build(frame, self.static))

    def call_generated_code(self, frame: dict, outputs: tuple[torch.Tensor, ...]) -> bool:
        """Call the graph's generated code itself from now on (`_generated_call`), if it is found and
        gives exactly `outputs` (the graph's outputs for `frame`, from a call through dynamo) when
        run again on `frame`: the forward writes the same K/V into the same cache rows, so running
        it twice changes nothing."""
        call = _generated_call(self.graph.fn, len(self.graph.graph_args))
        if call is None:
            return False
        again = call(self.build(frame, self.static))
        if len(again) != len(outputs) or not all(torch.equal(a, b) for a, b in zip(again, outputs)):
            return False
        self.call = call
        return True


def _generated_call(fn, num_inputs: int):
    """The calling code inductor generated for a graph (`CompiledFxGraph.current_callable`, taking
    the graph's inputs as one list) inside `fn`, what `compile_fx` returned for it; None where it
    is not found or its input count is not `num_inputs`.

    `fn` wraps that code in AOTAutograd's runtime wrappers, which on every call bump the version
    counters of the inputs the graph writes (the KV caches), turn grad mode off and on, and mark
    the outputs dynamic: nothing an engine's forward needs (it runs under inference_mode and its
    outputs never enter another compiled function), and ~50 us of interpreter work a step,
    about 3% of the shipped model's 16-slot step. The code is found by a search of the wrappers'
    closures (torch offers no accessor), and taken only when exactly one compiled graph is
    there and it takes all `num_inputs` inputs: a C++ wrapper reads exactly the handles its
    source says, and AOTAutograd passes a graph fewer inputs than dynamo's only after
    removing duplicated or aliased ones. Only graphs with the C++ wrapper qualify (a CPU
    engine's default; the wrapper's source states the count).
    """
    graph = compiled_fx_graph(fn)
    if graph is None or not callable(graph.current_callable) or not graph._boxed_call:
        return None
    counts = re.findall(r"steal_from_raw_handles_to_raii_handles\(input_handles, (\d+)\)", graph.source_code or "")
    return graph.current_callable if counts == [str(num_inputs)] else None


def compiled_fx_graph(fn):
    """The one `CompiledFxGraph` (inductor's compiled graph, with its generated `source_code`) inside
    `fn`, what `compile_fx` returned, found by a search of its wrappers' closures; None where there
    is not exactly one."""
    from torch._inductor.output_code import CompiledFxGraph

    found, seen, todo = [], set(), [fn]
    while todo and len(seen) < 64:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CompiledFxGraph):
            found.append(obj)
            continue
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        inner = getattr(obj, "compiled_fn", None)  # AOTAutograd's serializable wrapper
        if inner is not None:
            todo.append(inner)
    return found[0] if len(found) == 1 else None


# 0-dim int64 tensors of the sizes direct calls pass (bucketed sizes, exact key counts of batch-1
# steps): made once each, up to this many
_INT_TENSORS: dict[int, torch.Tensor] = {}
INT_TENSORS_MAX = 1 << 16


def _int_tensor(value: int) -> torch.Tensor:
    """A shared 0-dim int64 tensor holding `value`; the graph only reads it."""
    t = _INT_TENSORS.get(value)
    if t is None:
        t = torch.tensor(value)
        if len(_INT_TENSORS) < INT_TENSORS_MAX:
            _INT_TENSORS[value] = t
    return t


def _own_copy(fn: types.FunctionType) -> types.FunctionType:
    """`fn` with a code object of its own (named `fn`'s name plus a process-wide count):
    `torch.compile` keeps its graphs and guards per code object."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_COPIES)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
