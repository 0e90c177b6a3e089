"""`wedlm serve`: the OpenAI-compatible server and web chat on uvicorn.

Loads one `LLM`, wraps it with `wedlm.serve.create_app` (one engine loop shared by all
requests through continuous batching) and serves `/v1/completions`,
`/v1/chat/completions`, `/v1/models`, `/health`, `/metrics` and the web chat at `/`.
With `--replicas N` (or `--min-replicas/--max-replicas`) it deploys N such servers as Ray
Serve replicas behind one endpoint instead (`wedlm.serve.ray_app`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .options import UsageError, add_engine_args, int_at_least

EXAMPLES = """examples:
  wedlm serve --port 8000                      # the shipped model, web chat at http://127.0.0.1:8000/
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --host 0.0.0.0   # not run by tests: needs a GPU
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --tensor-parallel-size 2   # not run by tests: needs 2 GPUs
  wedlm serve --replicas 2 --port 8000         # not run by tests: runs until stopped; needs Ray Serve (pip install "wedlm[ray]")
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --min-replicas 1 --max-replicas 8   # not run by tests: needs GPUs and Ray

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "wedlm-tiny", "messages": [{"role": "user", "content": "Count from 1 to 10."}], "stream": true,
         "decoding": "wedlm", "wedlm_entropy_threshold": 0.6}'
"""


def add_parser(subparsers: Any) -> None:
    """Register `wedlm serve`."""
    parser = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server with SSE streaming and a web chat",
        description="Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
                    "/v1/models), with /health, Prometheus /metrics and a web chat at /. WeDLM knobs are "
                    "extra body fields: decoding, wedlm_window_size, wedlm_entropy_threshold, wedlm_pos_penalty_factor.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the `model` name clients send; default: the model folder's name")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn and wedlm log level (default: %(default)s)")
    add_replica_args(parser)
    add_engine_args(parser)
    parser.set_defaults(func=run)


def add_replica_args(parser: argparse.ArgumentParser) -> None:
    """--replicas, --min-replicas/--max-replicas and --ray-num-cpus (Ray Serve scale-out)."""
    group = parser.add_argument_group(
        "replicas (Ray Serve; RAY_ADDRESS names a cluster to join, else a local Ray instance is started)")
    group.add_argument("--replicas", type=int_at_least(1), default=1, metavar="N",
                       help="engine replicas behind one endpoint; > 1 deploys them with Ray Serve, one per "
                            "--tensor-parallel-size GPUs on CUDA, CPU replicas sharing the cores otherwise "
                            "(default: %(default)s, a single process without Ray)")
    group.add_argument("--min-replicas", type=int_at_least(0), default=None, metavar="N",
                       help="autoscale between --min-replicas and --max-replicas on the requests each "
                            "replica holds (with Ray Serve)")
    group.add_argument("--max-replicas", type=int_at_least(1), default=None, metavar="N",
                       help="upper autoscaling bound (with --min-replicas)")
    group.add_argument("--ray-num-cpus", type=int_at_least(1), default=None, metavar="N",
                       help="CPUs of the local Ray instance; CPU replicas split them (threads each = "
                            "N / most replicas); default: all of this machine's; not used with RAY_ADDRESS")


def run(args: argparse.Namespace) -> int:
    """Serve with one in-process engine, or with Ray Serve replicas when asked for."""
    if uses_ray(args):
        return run_replicas(args)
    return run_single(args)


def uses_ray(args: argparse.Namespace) -> bool:
    """Whether the options ask for Ray Serve replicas."""
    return args.replicas > 1 or args.min_replicas is not None or args.max_replicas is not None


def replica_spec(args: argparse.Namespace) -> Any:
    """The `ReplicaSpec` of the options.

    Raises:
        UsageError: conflicting replica options (the spec's own checks, naming the option).
    """
    from wedlm.serve.ray_app import ReplicaSpec

    from .options import llm_kwargs

    if args.replicas > 1 and args.min_replicas is not None:
        raise UsageError("--replicas is a fixed count; --min-replicas/--max-replicas autoscale: give one or the other")
    engine = llm_kwargs(args)
    model = engine.pop("model")
    try:
        return ReplicaSpec(model=model, served_model_name=args.served_model_name or Path(model).name, engine=engine,
                           num_replicas=args.replicas, min_replicas=args.min_replicas,
                           max_replicas=args.max_replicas)
    except ValueError as err:
        raise UsageError(str(err).replace("min_replicas", "--min-replicas").replace("max_replicas", "--max-replicas")) \
            from None


def run_replicas(args: argparse.Namespace) -> int:
    """Deploy the replicas on Ray Serve and serve until SIGINT/SIGTERM."""
    from wedlm.serve.ray_app import RayUnavailable, require_ray, run_cluster

    from .options import check_device, check_model

    spec = replica_spec(args)
    try:
        require_ray()
    except RayUnavailable as err:
        raise UsageError(str(err)) from None
    if not os.environ.get("RAY_ADDRESS"):  # a cluster's machines, not this one, hold the model and GPUs
        check_model(spec.model)
        check_device(args.device)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_cluster(spec, args.host, args.port, num_cpus=args.ray_num_cpus, log_level=args.log_level)
    except RuntimeError as err:  # Ray Serve could not deploy or Ray could not stop; its log says more
        print(f"wedlm serve: error: {err}", file=sys.stderr)
        return 1
    return 0


def run_single(args: argparse.Namespace) -> int:
    """Build the engine and app, then serve until interrupted."""
    import uvicorn

    from wedlm.serve import create_app

    from .options import load_llm

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    llm = load_llm(args, "serve")
    if llm is None:
        return 2
    name = args.served_model_name or Path(args.model).name
    app = create_app(llm, name)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        llm.close()  # tensor-parallel workers stop with the server
    return 0
