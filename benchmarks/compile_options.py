"""Inductor options for the compiled forward, A/B in one process: eager and several option sets,
stepped in turn, so load drifts on a shared CPU hit them alike.

Each configuration is an engine whose `CompiledForward` compiles its own copy of
`compiled.forward_logits` (a new code object: its own dynamo cache) with that configuration's
inductor options; every round runs one batch-1 request (`--decoding`, `--max-tokens`, ignore_eos)
on each engine; prints the median microseconds per step and the median of the per-round ratios
to the engine's own setting, and fails if any configuration's token ids differ.

    python benchmarks/compile_options.py [--rounds 15] [--configs eager,shipped,no-cache,python-wrapper,freezing]
    python benchmarks/compile_options.py --configs shipped,custom-op,module-guards,skip-guards --rounds 21
    python benchmarks/compile_options.py --configs shipped,no-cpp-ops --rounds 21 [--decoding ar]
    python benchmarks/compile_options.py --configs shipped,no-few-rows --rounds 21
    python benchmarks/compile_options.py --configs shipped,no-direct --rounds 21 [--decoding ar]
    python benchmarks/compile_options.py --configs shipped,gathered-kv --rounds 21 [--decoding ar --max-tokens 800]
    python benchmarks/compile_options.py --configs shipped --rounds 0 --kernels 20

`no-cpp-ops` is the shipped configuration without the engine's C++ operators (`engine/native.py`):
the oneDNN matmul as the Python operator (`wedlm::onednn_linear`, a CPU-only kernel), one-row
matmuls by BLAS and attention by SDPA; `no-few-rows` the shipped configuration with every matmul
of two or more rows by oneDNN (none by `wedlm_cpu::few_rows_mm`: `fast_model.FEW_ROWS_MAX` = 0
while its graphs are traced); `custom-op` the Python kernel registered by `torch.library.custom_op`
(autograd and Python-dispatch layers around it); `skip-guards` runs the shipped graphs under
`torch.compiler.set_stance(skip_guard_eval_unsafe=True)` once warm (only the guards that tell
the cached graphs apart are checked; not safe for an engine, measured to know what guards cost);
`gathered-kv` feeds the attention kernels a gathered copy of the step's keys and values, as
SDPA needs, instead of the paged caches and the slot table; `no-direct` sends every call of the
shipped engine through dynamo (no `compiled._DirectCall`);
`module-guards` keeps dynamo's guards on the model's modules, which the engine drops
(`torch.compiler.skip_guard_on_all_nn_modules_unsafe`; safe for a code object that sees one model).

`--kernels N` also prints torch.profiler's N ops with the most own CPU time over one more
request of the first configuration (where a compiled step's time goes: matmul kernels, the
custom-op wrapper around them, inductor's own kernels, dynamo's guard check).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

# what CompiledForward passes on a CPU: the C++ wrapper, no guards on the model's modules
SHIPPED = {"cpp_wrapper": True, "guard_filter_fn": "skip_guard_on_all_nn_modules_unsafe"}
CONFIGS = {
    "eager": None,
    "shipped": SHIPPED,
    "no-cache": {**SHIPPED, "fx_graph_cache": False},  # compiled afresh, not loaded from disk
    "python-wrapper": {**SHIPPED, "cpp_wrapper": False},
    "freezing": {**SHIPPED, "freezing": True},
    "no-cpp-ops": SHIPPED,
    "no-few-rows": SHIPPED,
    "custom-op": SHIPPED,
    "skip-guards": SHIPPED,
    "no-direct": SHIPPED,
    "gathered-kv": SHIPPED,
    "module-guards": {"cpp_wrapper": True},  # every guard dynamo makes, the model's modules' too
}


def _custom_op():
    """The oneDNN matmul as a `torch.library.custom_op` around the engine's own kernel."""
    import torch

    from wedlm.engine import fast_model

    def kernel(x, weight, bias, packed_key):
        return fast_model._linear_rows(x, weight, bias, fast_model._packed(packed_key), pad=False)

    op = torch.library.custom_op("wedlm_bench::onednn_linear", kernel, mutates_args=(),
                                 schema="(Tensor x, Tensor weight, Tensor? bias, int packed_key) -> Tensor")

    op.register_fake(fast_model._onednn_linear_fake)
    return op


@contextlib.contextmanager
def patched(name: str, warm: bool):
    """The process-wide setting a configuration runs under (the matmul operator its graph is
    traced with, the guard stance once warm), restored after."""
    import torch

    from wedlm.engine import fast_model
    from wedlm.model import attention

    shipped, native, kernels = fast_model._onednn_linear_op, fast_model._native_linear, dict(attention._cpu_attention)
    few_rows = fast_model.FEW_ROWS_MAX
    if name == "no-few-rows":
        fast_model.FEW_ROWS_MAX = 0
    if name in ("no-cpp-ops", "custom-op"):
        fast_model._native_linear = None
        attention.use_cpu_attention(None, None)
    if name == "gathered-kv" and kernels["window"] is not None:
        attention.use_cpu_attention(*_gathering(kernels["one_query"], kernels["window"]))
    if name == "custom-op":
        fast_model._onednn_linear_op = _CUSTOM_OP.setdefault("op", _custom_op())
    stance = torch.compiler.set_stance(skip_guard_eval_unsafe=True) if name == "skip-guards" and warm else None
    try:
        if stance is None:
            yield
        else:
            with stance:
                yield
    finally:
        fast_model._onednn_linear_op, fast_model._native_linear = shipped, native
        fast_model.FEW_ROWS_MAX = few_rows
        attention.use_cpu_attention(kernels["one_query"], kernels["window"])


_CUSTOM_OP: dict = {}


def _gathering(one_query, window):
    """The attention kernels fed a gathered [B, Hkv, Lk, D] copy of the step's keys and values
    (what SDPA needs) instead of the paged caches and the slot table."""
    from wedlm.model.attention import _rows

    def gathered(cache, slots):
        return _rows(cache, slots).transpose(1, 2)

    return (lambda q, k, v, scale, slots: one_query(q, gathered(k, slots), gathered(v, slots), scale),
            lambda q, k, v, mask, scale, slots: window(q, gathered(k, slots), gathered(v, slots), mask, scale))


def engine(model: str, name: str):
    """An engine for configuration `name`: the engine's own compiled forward (direct calls
    included) where the configuration uses the shipped inductor options, else a `torch.compile`
    with its options, every call through dynamo."""
    import torch

    from wedlm import LLM
    from wedlm.engine import compiled

    options = CONFIGS[name]
    llm = LLM(model, device="cpu", enforce_eager=options is None, enable_prefix_caching=False, max_num_seqs=1)
    forward = llm.engine.runner.compiled
    if name == "no-direct":
        forward._direct = None
    elif options is not None and (options != SHIPPED or name == "skip-guards"):
        options = {k: getattr(torch.compiler, v) if k == "guard_filter_fn" else v for k, v in options.items()}
        fn = compiled._own_copy(compiled.forward_logits)  # a code object of its own: its own dynamo cache
        forward._compiled, forward._direct = torch.compile(fn, dynamic=True, options=options), None
    return llm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "wedlm-tiny"))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--decoding", default="wedlm")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--kernels", type=int, default=0)
    args = ap.parse_args()
    import torch

    from wedlm import SamplingParams

    torch.set_num_threads(1)
    names = args.configs.split(",")
    prompt = [(3 * j) % 200 + 10 for j in range(24)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, decoding=args.decoding, ignore_eos=True)
    llms, ids = {}, {}
    for name in names:
        llms[name] = engine(args.model, name)
        start = time.perf_counter()
        with patched(name, warm=False):
            ids[name] = llms[name].generate([prompt], params)[0]["token_ids"]  # warm-up: compiles
        print(f"{name}: warm-up (compile) {time.perf_counter() - start:.1f} s", flush=True)
    if any(v != ids[names[0]] for v in ids.values()):
        print("token ids differ between configurations")
        return 1
    per_step = {n: [] for n in names}
    steps, got = 0, []
    for _ in range(args.rounds):
        for name, llm in llms.items():
            llm.add_request(prompt, params)
            with patched(name, warm=True):
                steps, start = 0, time.perf_counter()
                while llm.has_unfinished():
                    got.extend(t for delta in llm.step() for t in delta.new_token_ids)
                    steps += 1
                per_step[name].append(1e6 * (time.perf_counter() - start) / steps)
            if got != ids[name]:
                print(f"{name}: token ids changed in a timed round")
                return 1
            got.clear()
    if args.kernels:
        from torch.profiler import ProfilerActivity, profile

        llm = llms[names[0]]
        llm.add_request(prompt, params)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            steps = 0
            while llm.has_unfinished():
                llm.step()
                steps += 1
        print(f"\n{names[0]}: {steps} steps under torch.profiler (its own overhead included)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.kernels))
    if not args.rounds:
        return 0
    base = "shipped" if "shipped" in names else names[0]
    print(f"\nbatch 1, {args.decoding}, {steps} steps, {args.rounds} rounds, one thread; ratio = median of "
          f"per-round ratios to {base}")
    print("| configuration | median step (us) | ratio |\n|---|---|---|")
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(per_step[name], per_step[base]))
        print(f"| {name} | {statistics.median(per_step[name]):.0f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
