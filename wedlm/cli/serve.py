"""`wedlm serve`: the OpenAI-compatible server and web chat on uvicorn.

Loads one `LLM`, wraps it with `wedlm.serve.create_app` (one engine loop shared by all
requests through continuous batching) and serves `/v1/completions`,
`/v1/chat/completions`, `/v1/models`, `/health`, `/metrics` and the web chat at `/`.
With `--replicas N` (or `--min-replicas/--max-replicas`) it deploys N such servers as Ray
Serve replicas behind one endpoint instead (`wedlm.serve.ray_app`).
Access control (`--api-key` or `WEDLM_API_KEY`, `--allowed-hosts`, `--cors-origins`,
`--public-paths`) and work limits (`--max-seqs-per-request`, `--max-queued-seqs`) are
checked by `wedlm.serve.security.AccessPolicy` and `wedlm.serve.limits.ServeLimits`.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from .options import UsageError, add_engine_args, int_at_least, int_between

API_KEY_ENV = "WEDLM_API_KEY"

EXAMPLES = """examples:
  wedlm serve --port 8000                      # the shipped model, web chat at http://127.0.0.1:8000/
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --host 0.0.0.0   # not run by tests: needs a GPU
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --tensor-parallel-size 2   # not run by tests: needs 2 GPUs
  wedlm serve --replicas 2 --port 8000         # not run by tests: runs until stopped; needs Ray Serve (pip install "wedlm[ray]")
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --min-replicas 1 --max-replicas 8   # not run by tests: needs GPUs and Ray
  WEDLM_API_KEY=secret wedlm serve --host 0.0.0.0 --allowed-hosts box.lan   # not run by tests: a server reachable from the network

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
    parser.add_argument("--port", type=int_between(1, 65535), default=8000,
                        help="TCP port to bind, 1..65535 (default: %(default)s)")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the `model` name clients send; default: the model folder's name")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn and wedlm log level (default: %(default)s)")
    add_replica_args(parser)
    add_access_args(parser)
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


def add_access_args(parser: argparse.ArgumentParser) -> None:
    """API key, Host and CORS allow-lists, and the work limits of one server."""
    from wedlm.serve.limits import DEFAULT_MAX_QUEUED_SEQS, DEFAULT_MAX_SEQS_PER_REQUEST
    from wedlm.serve.security import DEFAULT_PUBLIC_PATHS

    group = parser.add_argument_group("access and limits")
    group.add_argument("--api-key", default=None, metavar="KEY",
                       help=f"require 'Authorization: Bearer KEY' on every path but --public-paths and the web "
                            f"chat's files (401 otherwise); default: ${API_KEY_ENV}, else no key")
    group.add_argument("--public-paths", type=comma_list, default=DEFAULT_PUBLIC_PATHS, metavar="PATHS",
                       help="comma-separated paths served without the API key ('' for none; default: "
                            f"{','.join(DEFAULT_PUBLIC_PATHS)})")
    group.add_argument("--allowed-hosts", type=comma_list, default=None, metavar="HOSTS",
                       help="comma-separated Host names served (any port; '*' = any; 421 otherwise); default: "
                            "loopback names only on a loopback --host (DNS rebinding protection), any otherwise")
    group.add_argument("--cors-origins", type=comma_list, default=(), metavar="ORIGINS",
                       help="comma-separated origins allowed to call the API from a browser (CORS; '*' = any); "
                            "default: none")
    group.add_argument("--max-seqs-per-request", type=int_at_least(1), default=DEFAULT_MAX_SEQS_PER_REQUEST,
                       metavar="N", help="most sequences (prompts x n) one request may start; 400 beyond "
                                         "(default: %(default)s)")
    group.add_argument("--max-queued-seqs", type=int_at_least(1), default=DEFAULT_MAX_QUEUED_SEQS, metavar="N",
                       help="most sequences the server holds at once, waiting or running; 429 with "
                            "Retry-After beyond (default: %(default)s)")


def comma_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated values, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def access_policy(args: argparse.Namespace) -> Any:
    """The `AccessPolicy` of the flags (the key from --api-key, else $WEDLM_API_KEY).

    Raises:
        ValueError: a bad value, naming the knob (`AccessPolicy`'s check).
    """
    from wedlm.serve.security import AccessPolicy

    key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    return AccessPolicy.for_bind(args.host, key, args.public_paths, args.allowed_hosts, args.cors_origins)


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
    from wedlm.serve.limits import ServeLimits

    engine = llm_kwargs(args)
    model = engine.pop("model")
    try:
        return ReplicaSpec(model=model, served_model_name=args.served_model_name or Path(model).name, engine=engine,
                           num_replicas=args.replicas, min_replicas=args.min_replicas,
                           max_replicas=args.max_replicas, access=access_policy(args),
                           limits=ServeLimits(args.max_seqs_per_request, args.max_queued_seqs))
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


def bind_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound (None when it can), found before the model loads: loading
    a large model and then failing in uvicorn on a taken port wastes minutes. Binds and closes a
    socket with SO_REUSEADDR, as uvicorn does (a port left in TIME_WAIT is usable, a listening one
    is not)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        return f"--host {host}: {err.strerror}"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            return f"--port {port}: cannot bind {host}:{port}: {err.strerror}"
    return None


def run_single(args: argparse.Namespace) -> int:
    """Build the engine and app, then serve until interrupted."""
    import uvicorn

    from wedlm.serve import create_app
    from wedlm.serve.limits import ServeLimits
    from wedlm.serve.security import is_loopback

    from .options import load_llm

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        access = access_policy(args)
        limits = ServeLimits(args.max_seqs_per_request, args.max_queued_seqs)
    except ValueError as err:
        print(f"wedlm serve: error: {err}", file=sys.stderr)
        return 2
    problem = bind_problem(args.host, args.port)
    if problem:
        print(f"wedlm serve: error: {problem}", file=sys.stderr)
        return 2
    if access.api_key is None and not is_loopback(args.host):
        logging.getLogger(__name__).warning("serving on %s without an API key (--api-key or $%s)",
                                            args.host, API_KEY_ENV)
    llm = load_llm(args, "serve")
    if llm is None:
        return 2
    if not llm.engine.enforce_eager:  # compile before the port opens, not in the first requests
        logging.getLogger(__name__).info("compiling the forward before serving (seconds with a warm compile "
                                         "cache, up to a minute or two without)")
        llm.warm_up()
    name = args.served_model_name or Path(args.model).name
    app = create_app(llm, name, access=access, limits=limits)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        llm.close()  # tensor-parallel workers stop with the server
    return 0
