"""`wedlm bench`: the speed benchmark (WeDLM decoders vs AR vs transformers), a thin wrapper.

Parses the command line into a `BenchConfig`, runs `wedlm.bench.runner.run_bench`
and writes `benchmarks.json`, `benchmarks.md` and `img/bench_*.png` into
`--out-dir` (`--out-dir docs` regenerates docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..bench.peer import PEERS
from ..bench.tasks import BENCH_TASKS
from ..engine.defaults import DEFAULT_ENTROPY_THRESHOLD
from .options import (
    UsageError,
    add_revision_arg,
    add_runtime_args,
    add_speed_args,
    apply_threads,
    bad_knob_option,
    check_device,
    check_engine_options,
    check_model,
    check_output,
    default_model,
    int_at_least,
    non_negative_float,
)

EXAMPLES = """examples:
  wedlm bench --quick                      # about a minute on a laptop CPU
  wedlm bench --out-dir docs               # regenerate docs/benchmarks.md and docs/img/bench_*.png
  wedlm bench --model /models/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --tasks arithmetic,text   # not run by tests: needs a GPU
  wedlm bench --slot-cost --quick          # the slot-cost curve only (shipped model, eager and compiled)
  wedlm bench --slot-cost --slot-cost-models models/wedlm-tiny,random-40m,random-150m --out-dir docs   # not run by tests: minutes of timing
  wedlm bench --peer llama.cpp --out-dir docs   # not run by tests: minutes of timing; needs llama-cpp-python
"""


def _floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers (thresholds, penalties; their ranges are the library's check_knob)."""
    values = tuple(_number(x) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1 (batch sizes)."""
    values = tuple(int_at_least(1)(x) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _task_names(text: str) -> tuple[str, ...]:
    """Comma-separated bench tasks, each one of `BENCH_TASKS`."""
    names = _names(text)
    unknown = [n for n in names if n not in BENCH_TASKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown task(s) {', '.join(unknown) or repr(text)}; "
                                         f"the tasks are {', '.join(BENCH_TASKS)}")
    return names


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="speed benchmark: wedlm decoders vs ar vs transformers generate",
        description="Run counting / arithmetic / list operations / code / open-ended text through WeDLM streaming decoding "
                    "(a sweep of tau and lambda), block-wise, verified, AR and transformers generate on the "
                    "same weights, timed pair by pair; write JSON, markdown and plots.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=default_model(),
                   help="model folder, .gguf file or hub id org/name (default: the shipped %(default)s)")
    add_revision_arg(p)
    p.add_argument("--quick", action="store_true", help="small sweep and budgets: about a minute")
    p.add_argument("--out-dir", default="bench_out",
                   help="where benchmarks.json, benchmarks.md and img/ go (default: %(default)s)")
    p.add_argument("--tasks", type=_task_names, default=None, help="comma-separated subset of " + ",".join(BENCH_TASKS))
    p.add_argument("--taus", type=_floats, default=None, metavar="T1,T2", help="entropy thresholds for wedlm")
    p.add_argument("--lambdas", type=_floats, default=None, metavar="L1,L2",
                   help="distance penalties: the first for the tau sweep, the rest at --lambda-tau")
    p.add_argument("--lambda-tau", type=non_negative_float, default=DEFAULT_ENTROPY_THRESHOLD,
                   help="tau for the lambda sweep (default: %(default)s)")
    p.add_argument("--blockwise-taus", type=_floats, default=None, metavar="T1,T2", help="thresholds for blockwise")
    p.add_argument("--batch-sizes", type=_ints, default=(1, 8), help="default: 1,8")
    p.add_argument("--repeats", type=int_at_least(1), default=None, help="timed repeats (default: 3, quick: 1)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=None, help="override every task's generation budget")
    p.add_argument("--wedlm-window-size", "--window-size", dest="window_size", type=int, default=None, metavar="W",
                   help="decoding window (default: the model's generation_config.json, else 16)")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers generate peer")
    p.add_argument("--no-verified", action="store_true", help="skip the verified decoder")
    p.add_argument("--prefix-caching", action="store_true",
                   help="let the engine reuse prompt KV across requests (off: every system prefills every prompt)")
    p.add_argument("--no-plots", action="store_true", help="write JSON and markdown only")
    p.add_argument("--peer", choices=PEERS, default=None,
                   help="run only the peer section: llama.cpp AR (llama-cpp-python, optional) on the model written "
                        "as float32 GGUF (Q8_0 with --quantization int8), beside the engine's wedlm, verified and "
                        "ar, batch 1, one thread each (--threads), whole-answer wall clock; --enforce-eager / "
                        "--no-enforce-eager keep one forward mode (default: both); writes llama_cpp_peer.json, "
                        "llama_cpp_peer.md and img/bench_llama_cpp_peer.png (llama_cpp_peer_q8_0.* with int8)")
    p.add_argument("--slot-cost", action="store_true",
                   help="run only the slot-cost section: one forward with W = 1..64 window slots over a cached "
                        "prefix, eager and compiled, with the break-even tokens/forward of wedlm vs ar "
                        "(writes slot_cost.json, slot_cost.md, img/bench_slot_cost.png)")
    p.add_argument("--slot-cost-models", type=_names, default=None, metavar="M1,M2",
                   help="slot-cost models: folders or random-40m / random-150m (random-weight Qwen3 shapes); "
                        "default: --model, random-40m, random-150m (quick: --model)")
    p.add_argument("--slot-cost-prefix", type=int_at_least(1), default=None, metavar="N",
                   help="cached prefix of the slot-cost forwards (default: 512, quick: 128)")
    add_runtime_args(p)
    add_speed_args(p)
    p.set_defaults(func=run)
    return p


def config_from_args(args: argparse.Namespace, command: str = ""):
    """`BenchConfig` from parsed options; --quick shrinks the sweep unless options say otherwise."""
    from wedlm.bench.runner import BenchConfig

    quick = args.quick
    picked = {
        "taus": args.taus or ((0.4, 0.9) if quick else (0.2, 0.4, 0.6, 0.9)),
        "lambdas": args.lambdas or ((0.02,) if quick else (0.02, 0.10)),
        "blockwise_taus": args.blockwise_taus or ((0.9,) if quick else (0.4, 0.9)),
        "repeats": args.repeats or (1 if quick else 3),
    }
    return BenchConfig(model=args.model, tasks=args.tasks or BENCH_TASKS, lambda_tau=args.lambda_tau,
                       batch_sizes=args.batch_sizes, max_tokens=args.max_tokens,
                       verified=not args.no_verified, transformers=not args.no_transformers,
                       window_size=args.window_size, prefix_caching=args.prefix_caching, device=args.device, dtype=args.dtype, quick=quick,
                       enforce_eager=args.enforce_eager, autocast=args.autocast,
                       quantization=args.quantization,
                       command=command, **picked)


def slot_cost_config(args: argparse.Namespace):
    """`SlotCostConfig` from parsed options; --quick: the --model only, W in 1, 4, 16, prefix 128."""
    from wedlm.bench.slot_cost import QUICK_SLOTS, SlotCostConfig

    quick = args.quick
    models = args.slot_cost_models or ((args.model,) if quick else (args.model, "random-40m", "random-150m"))
    modes = ("eager", "compiled") if args.enforce_eager is None else \
        (("eager",) if args.enforce_eager else ("compiled",))
    extra = {"slots": QUICK_SLOTS, "tpf_max_tokens": 32} if quick else {}
    return SlotCostConfig(models=tuple(models), prefix=args.slot_cost_prefix or (128 if quick else 512),
                          repeats=args.repeats or (3 if quick else 20), modes=modes, window_size=args.window_size,
                          device=args.device, dtype=args.dtype, autocast=args.autocast, **extra)


def run_slot_cost_section(args: argparse.Namespace) -> int:
    from wedlm.bench.slot_cost import run_slot_cost, write_slot_cost

    result = run_slot_cost(slot_cost_config(args))
    paths = write_slot_cost(result, args.out_dir, plots=not args.no_plots)
    print(f"machine: {result['machine_line']}")
    for r in result["rows"]:
        tpf = "-" if r["tokens_per_forward"] is None else f"{r['tokens_per_forward']:.2f}"
        ratio = "" if r["ratio_16_vs_1"] is None else f", 16 vs 1 slot {r['ratio_16_vs_1']:.2f}x"
        over = "".join(f", {d} step/bare {o['overhead']:.2f}x" for d, o in r["engine_overhead"].items()
                       if o["overhead"] is not None)
        forward = f"{r['precision']}; {r.get('matmuls', 'BLAS matmuls')}"
        print(f"  {r['model']} ({r['mode']}, {forward}): break-even {r['break_even']:.2f} tokens/forward "
              f"at W={r['window']}, measured {tpf}{ratio}{over}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def peer_config(args: argparse.Namespace, command: str = ""):
    """`PeerConfig` from parsed options: both forward modes unless --enforce-eager / --no-enforce-eager
    picks one; one thread each unless --threads says otherwise."""
    from wedlm.bench.peer import PEER_TASKS, PeerConfig

    modes = ("eager", "compiled") if args.enforce_eager is None else \
        (("eager",) if args.enforce_eager else ("compiled",))
    return PeerConfig(model=args.model, tasks=args.tasks or PEER_TASKS, quick=args.quick, max_tokens=args.max_tokens,
                      repeats=args.repeats or (1 if args.quick else 3), modes=modes, threads=args.threads or 1,
                      window_size=args.window_size, autocast=args.autocast, quantization=args.quantization,
                      command=command)


def run_peer_section(args: argparse.Namespace, command: str) -> int:
    """`--peer llama.cpp`: UsageError (stderr, exit 2) when llama-cpp-python is missing or the model
    cannot be written as GGUF."""
    from wedlm.bench.gguf_export import GGUFExportError
    from wedlm.bench.peer import PeerUnavailable, import_llama_cpp, run_peer, write_peer

    if args.dtype not in (None, "float32"):  # the engine reads the float32 weights the GGUF file is written from
        raise UsageError(f"--peer llama.cpp runs float32 weights (--quantization int8 or bf16 for the others), "
                         f"got --dtype {args.dtype}")
    try:
        import_llama_cpp()
        cfg = peer_config(args, command)
        result = run_peer(cfg)
    except (PeerUnavailable, GGUFExportError, ValueError) as err:
        raise UsageError(str(err)) from None
    paths = write_peer(result, args.out_dir, plots=not args.no_plots)
    print(f"machine: {result['machine_line']}; llama-cpp-python {result['llama_cpp']}")
    for r in result["results"]:
        if r["system"] != "llama.cpp":
            print(f"  {r['task']}: {r['system']} {r['speedup_vs_llama_cpp']:.2f}x llama.cpp, "
                  f"{r['tokens_per_forward']:.2f} tok/forward, same answers {r['same_as_llama_cpp']}/{r['items']}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    from wedlm.bench.report import targets, write_report
    from wedlm.bench.runner import run_bench

    if bad_knob_option(args, "bench"):
        return 2
    apply_threads(args)
    check_device(args.device)
    check_engine_options(args)
    check_output(args.out_dir, "--out-dir", folder=True)
    if args.slot_cost:
        return run_slot_cost_section(args)
    argv = sys.argv[1:] if sys.argv[1:2] == ["bench"] else ["bench", "..."]
    if args.peer:
        check_model(args.model)
        return run_peer_section(args, shlex.join(["wedlm", *argv]))
    try:
        cfg = config_from_args(args, shlex.join(["wedlm", *argv]))
    except ValueError as err:
        raise UsageError(str(err)) from None
    check_model(args.model)
    result = run_bench(cfg)
    paths = write_report(result, args.out_dir, plots=not args.no_plots)
    print(f"machine: {result['machine_line']}")
    for t in targets(result):
        value = f"- ({t['why']})" if t["value"] is None else f"{t['value']:.2f}x"
        print(f"  [{'met' if t['met'] else 'not met'}] {t['claim']}: {value} (target {t['target']:g}x, {t['system']})")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
