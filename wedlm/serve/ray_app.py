"""Ray Serve deployment of the OpenAI server: N engine replicas behind one HTTP endpoint.

Each replica is a Ray actor that loads one `LLM` and serves the unchanged FastAPI app of
`create_app` as the deployment's ASGI ingress (the app is built on the replica by the
ingress builder), so routes, SSE streaming, OpenAI error bodies, client-disconnect aborts
and `/metrics` are exactly single-process `wedlm serve`'s. Ray Serve's HTTP proxy receives
the request and hands the ASGI connection to one replica; no second hop re-encodes the
stream. Every response carries `x-wedlm-replica: <replica id>@<host>:<pid>`, and the
proxy runs `wedlm.serve.ray_proxy`'s middleware, which retries once a request whose replica
died before answering and gives a cut SSE stream its error event and `[DONE]`.

Placement: a CPU replica reserves `threads` Ray CPUs and runs torch on that many threads,
so replicas never oversubscribe a node's cores; a CUDA replica reserves
`tensor_parallel_size` GPUs (one replica per GPU by default). GPU placement is written
against Ray's `num_gpus` but has only run on CPU machines here. Ray restarts a replica whose
process dies while the other replicas keep serving; the requests it held are retried once
(nothing answered yet) or end with the error a single server gives (a stream cut mid-way).

`run_cluster` is what `wedlm serve --replicas N` runs: it starts a local Ray instance (or
joins the cluster named by `RAY_ADDRESS`), deploys, waits for SIGINT/SIGTERM, and on the way
out deletes the application, shuts Ray down and checks that the Ray processes it started
have exited. `app_builder` is the same application for `serve run` / `serve deploy`:

    serve run wedlm.serve.ray_app:app_builder model=/path/to/model num_replicas=2

Ray is optional (`pip install "wedlm[ray]"`); without it, `require_ray` raises
`RayUnavailable` naming that command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from .ray_proxy import IMPORT_PATH as PROXY_IMPORT_PATH

log = logging.getLogger(__name__)
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"

INSTALL_HINT = 'pip install "wedlm[ray]"  (or: pip install "ray[serve]>=2.60")'
APP_NAME = "wedlm"
REPLICA_HEADER = "x-wedlm-replica"


class RayUnavailable(ImportError):
    """Ray Serve is not installed; the message names the install command."""


def require_ray() -> tuple[Any, Any]:
    """`(ray, ray.serve)`.

    Raises:
        RayUnavailable: Ray Serve cannot be imported.
    """
    try:
        import ray
        from ray import serve
    except ImportError as err:
        raise RayUnavailable(f"serving replicas with Ray needs Ray Serve ({err}); install it: {INSTALL_HINT}") \
            from None
    return ray, serve


@dataclass
class ReplicaSpec:
    """What every replica loads and how Ray places and scales the replicas.

    Args:
        model: checkpoint folder, present at this path on every Ray node.
        served_model_name: the `model` clients send (default: the folder's name).
        engine: keyword arguments of `wedlm.LLM` besides `model` (device, dtype, limits).
        num_replicas: fixed replica count (used when `min_replicas` is None).
        min_replicas, max_replicas: autoscaling bounds; both or neither.
        threads: torch CPU threads (= Ray CPUs reserved) per CPU replica; None = the host's
            CPUs divided by the largest replica count, at least 1 (set by `fit_threads`).
        target_ongoing_requests: autoscaling target per replica (requests held, running or
            waiting in its engine); None = the engine's batch size (`max_num_seqs`, default 64).
        access, limits: every replica's `AccessPolicy` and `ServeLimits` (`create_app`'s; the
            Ray proxy passes the client's Host and Authorization headers through unchanged).

    Raises:
        ValueError: a count below its minimum, `max_replicas < min_replicas`, or one bound
            without the other, naming the field.
    """

    model: str
    served_model_name: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    threads: int | None = None
    target_ongoing_requests: int | None = None
    access: Any = None
    limits: Any = None

    def __post_init__(self) -> None:
        for name, low in (("num_replicas", 1), ("min_replicas", 0), ("max_replicas", 1), ("threads", 1),
                          ("target_ongoing_requests", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("min_replicas and max_replicas go together (autoscaling bounds); give both or neither")
        if self.min_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")

    @property
    def most_replicas(self) -> int:
        """The largest number of replicas that can run at once."""
        return self.max_replicas if self.max_replicas is not None else self.num_replicas

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica reserves: its tensor-parallel size on CUDA, else 0."""
        if not str(self.engine.get("device") or "cpu").startswith("cuda"):
            return 0
        return int(self.engine.get("tensor_parallel_size") or 1)

    def fit_threads(self, host_cpus: int, largest_node: int | None = None) -> ReplicaSpec:
        """A copy whose `threads` splits `host_cpus` (all the CPUs Ray offers) among the most
        replicas, no more than `largest_node` (the CPUs of the biggest machine: a replica runs
        on one), at least 1; unchanged when `threads` is set. GPU replicas take 1."""
        if self.threads is not None:
            return self
        share = 1 if self.gpus_per_replica else max(1, host_cpus // self.most_replicas)
        if largest_node:
            share = max(1, min(share, largest_node))
        return dataclasses.replace(self, threads=share)

    def deployment_options(self) -> dict[str, Any]:
        """`serve.deployment` options: actor resources, concurrency and replica count or autoscaling."""
        batch = int(self.engine.get("max_num_seqs") or 64)
        target = self.target_ongoing_requests or batch
        options: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.threads or 1, "num_gpus": self.gpus_per_replica},
            # the engine batches continuously: let a replica hold a full batch plus a queue as long
            "max_ongoing_requests": max(2 * batch, target),
        }
        if self.min_replicas is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                             "initial_replicas": max(self.min_replicas, 1),
                                             "target_ongoing_requests": target}
        return options


class ReplicaHeader:
    """ASGI middleware: adds `x-wedlm-replica: <name>` to every HTTP response."""

    def __init__(self, app: Any, name: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), name.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def replica_name() -> str:
    """`<Ray Serve replica id>@<host>:<pid>` of the running replica (`pid` alone outside Ray Serve)."""
    where = f"{socket.gethostname()}:{os.getpid()}"
    try:
        from ray import serve

        return f"{serve.get_replica_context().replica_id.unique_id}@{where}"
    except Exception:  # not inside a replica (a direct call in a test)
        return where


def replica_app(spec: ReplicaSpec) -> Any:
    """The FastAPI app of one replica: its own `LLM`, torch threads set, replica header added."""
    import torch

    from wedlm import LLM

    from .app import create_app

    if spec.threads and not spec.gpus_per_replica:
        torch.set_num_threads(spec.threads)
    llm = LLM(model=spec.model, **spec.engine)
    llm.warm_up()  # compiled graphs before the replica takes traffic
    app = create_app(llm, spec.served_model_name, access=spec.access, limits=spec.limits)
    app.add_middleware(ReplicaHeader, name=replica_name())
    close_with_app(app, llm)
    return app


def close_with_app(app: Any, llm: Any) -> None:
    """Close `llm` (its tensor-parallel workers) after the app's own shutdown, as
    `wedlm serve` does after uvicorn returns: Ray ends a replica through the app's lifespan."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any):
        try:
            async with inner(a) as state:
                yield state
        finally:
            llm.close()

    app.router.lifespan_context = lifespan


def build_application(spec: ReplicaSpec) -> Any:
    """The Ray Serve application (`serve.run`-able) of `spec`'s replicas."""
    _, serve = require_ray()

    def build_on_replica() -> Any:  # evaluated on each replica when it starts
        return replica_app(spec)

    ingress = serve.ingress(build_on_replica)()
    deployment = serve.deployment(ingress, name="WedlmReplica", **spec.deployment_options())
    return deployment.bind()


BUILDER_KEYS = {"model": str, "served_model_name": str, "num_replicas": int, "min_replicas": int,
                "max_replicas": int, "threads": int, "target_ongoing_requests": int}
ENGINE_KEYS = {"device": str, "dtype": str, "max_model_len": int, "max_num_seqs": int, "kv_block_size": int,
               "tensor_parallel_size": int, "wedlm_window_size": int}


def app_builder(args: dict[str, str]) -> Any:
    """`serve run wedlm.serve.ray_app:app_builder key=value ...`: the application of
    `ReplicaSpec` fields (`model`, `num_replicas`, `min_replicas`, `max_replicas`, `threads`, ...)
    and `LLM` options (`device`, `dtype`, `max_model_len`, `max_num_seqs`, ...).

    Raises:
        ValueError: no `model`, an unknown key or a value that is not of its type, naming the key.
    """
    if "model" not in args:
        raise ValueError("model is required: the checkpoint folder, e.g. model=/models/WeDLM-8B-Instruct")
    spec_kwargs: dict[str, Any] = {}
    engine: dict[str, Any] = {"device": "cpu", "dtype": "float32"}
    for key, text in args.items():
        kind = BUILDER_KEYS.get(key) or ENGINE_KEYS.get(key)
        if kind is None:
            raise ValueError(f"unknown argument {key!r}; known: {', '.join([*BUILDER_KEYS, *ENGINE_KEYS])}")
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{key} must be {kind.__name__}, got {text!r}") from None
        (spec_kwargs if key in BUILDER_KEYS else engine)[key] = value
    spec = ReplicaSpec(engine=engine, **spec_kwargs)
    return build_application(spec.fit_threads(os.cpu_count() or 1))


# ----- the `wedlm serve --replicas N` process -----

def run_cluster(spec: ReplicaSpec, host: str, port: int, address: str | None = None,
                num_cpus: int | None = None, log_level: str = "warning") -> None:
    """Deploy `spec` on Ray and serve on `host:port` until SIGINT or SIGTERM.

    Args:
        address: a Ray cluster to join (default: `RAY_ADDRESS`, else a local instance started here).
        num_cpus: CPUs the local instance offers (default: all of this machine's); not used
            when joining a cluster.

    Raises:
        RayUnavailable: Ray Serve is not installed.
        RuntimeError: Ray processes this call started are still alive after shutdown.
    """
    import psutil

    ray, serve = require_ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    level = getattr(logging, log_level.upper(), logging.WARNING)
    if address:
        ray.init(address=address, logging_level=level)
    else:
        # inherited by the Ray processes started here, the HTTP proxy among them
        os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_IMPORT_PATH)
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=level)
    try:
        nodes = [int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]
        spec = spec.fit_threads(int(ray.cluster_resources().get("CPU", 1)), max(nodes, default=None))
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_application(spec), name=APP_NAME, route_prefix="/", blocking=False)
        log.warning("serving %s on http://%s:%d with %s", spec.served_model_name or spec.model, host, port,
                    replicas_text(spec))
        wait_for_stop()
    finally:
        # every process below this one that Ray started: its daemons and the replica workers
        started = [p for p in me.children(recursive=True) if p.pid not in before]
        stop_ray(ray, serve, joined=bool(address), started=started)


def replicas_text(spec: ReplicaSpec) -> str:
    """`2 replicas x 1 thread` / `1..4 replicas (autoscaled) x 2 threads` / `... x 1 GPU`."""
    count = (f"{spec.min_replicas}..{spec.max_replicas} replicas (autoscaled)" if spec.min_replicas is not None
             else f"{spec.num_replicas} replica{'s' if spec.num_replicas != 1 else ''}")
    each = f"{spec.gpus_per_replica} GPU" if spec.gpus_per_replica else f"{spec.threads} thread"
    return f"{count} x {each}{'s' if not each.startswith('1 ') else ''}"


def wait_for_stop() -> None:
    """Block until SIGINT or SIGTERM (both end the wait the same way)."""
    stop = []

    def handler(signum, frame):
        stop.append(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_ray(ray: Any, serve: Any, joined: bool, started: list[Any], timeout: float = 30.0) -> None:
    """Stop the replicas, then Ray; the processes of a local instance must all exit.

    On a joined cluster only this application is deleted (other Serve applications and the
    cluster keep running). A local instance's processes (`started`, psutil handles) that
    outlive `ray.shutdown()` by `timeout` seconds are killed, and reported.

    Raises:
        RuntimeError: some started process could not be stopped.
    """
    import psutil

    try:
        if joined:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
    except Exception:  # Ray itself is going away below; nothing more to save here
        log.exception("stopping Ray Serve failed")
    ray.shutdown()
    _, alive = psutil.wait_procs(started, timeout=timeout)
    for proc in alive:
        log.warning("Ray process %d (%s) outlived ray.shutdown(); killing it", proc.pid, proc_name(proc))
        proc.kill()
    _, still = psutil.wait_procs(alive, timeout=5)
    if still:
        raise RuntimeError(f"Ray processes still running after shutdown: {[p.pid for p in still]}")


def proc_name(proc: Any) -> str:
    try:
        return proc.name()
    except Exception:
        return "?"
