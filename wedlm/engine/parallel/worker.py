"""The process of one tensor-parallel rank >= 1 (started as `python -m wedlm.engine.parallel SPEC_JSON RANK`).

A worker loads its slices of the checkpoint, allocates the KV cache of its own
KV heads, reports `{"event": "ready", ...}` on its stdout (a line of JSON; any
other output of the process goes to stderr), joins the process group, and then
runs forwards in lockstep: rank 0 broadcasts each step's `ForwardItem`s on the
control group and every rank runs the same forward (`ModelRunner.run`), taking
part in its all-reduces and all-gathers. A broadcast of None stops it.

It never outlives rank 0: its stdin is a pipe from rank 0, and a watchdog
thread exits the process when that pipe closes (rank 0 exited, crashed or was
killed); a lost peer also breaks the collective it waits in. It ignores SIGINT
(Ctrl-C reaches the whole process group; rank 0 decides how to stop). On any
error it reports `{"event": "error", "message": ...}` and exits with code 1.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import timedelta


@dataclass(slots=True)
class WorkerSpec:
    """What every rank >= 1 needs to build its part of the engine (sent as JSON on the command line).

    Attributes:
        model: checkpoint folder.
        dtype: float32 / bfloat16 / float16.
        devices: device of each rank, e.g. ["cpu", "cpu"] or ["cuda:0", "cuda:1"].
        num_blocks, block_size: the KV cache rank 0 allocated (block tables are shared).
        fast_path: fused modules, as on rank 0.
        port: rank 0's TCPStore port on 127.0.0.1.
        num_threads: torch CPU threads per rank.
        timeout_s: limit of a collective in a forward (a stuck rank fails the step after it).
        enforce_eager: False = the compiled forward, as on rank 0 (every rank pads to the same buckets).
    """

    model: str
    dtype: str
    devices: list[str]
    num_blocks: int
    block_size: int
    fast_path: bool
    port: int
    num_threads: int
    timeout_s: float
    enforce_eager: bool = True

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


# The control group carries the step inputs; a worker waits on it for as long as rank 0 is idle.
CONTROL_TIMEOUT = timedelta(days=365)


def backend_for(device: str) -> str:
    """NCCL between CUDA devices, gloo otherwise."""
    return "nccl" if device.startswith("cuda") else "gloo"


def join_group(spec: WorkerSpec, rank: int, store):
    """Join the default process group (forward collectives) and return the gloo control group."""
    import torch.distributed as dist

    dist.init_process_group(backend_for(spec.devices[rank]), store=store, rank=rank,
                            world_size=spec.world_size, timeout=timedelta(seconds=spec.timeout_s))
    return dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def watch_parent() -> None:
    """Exit the process as soon as rank 0's end of our stdin closes (run in a daemon thread)."""
    try:
        while os.read(0, 1 << 16):
            pass
    finally:
        os._exit(1)


def main(spec: WorkerSpec, rank: int, report) -> None:
    """Load, report ready, join the group, run forwards until the stop broadcast."""
    import torch
    import torch.distributed as dist

    from ..runner import ModelRunner
    from .loading import load_model_shard

    torch.set_num_threads(spec.num_threads)
    device = torch.device(spec.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = load_model_shard(spec.model, spec.dtype, device, rank, spec.world_size)
    runner = ModelRunner(model, spec.num_blocks, spec.block_size, spec.fast_path, enforce_eager=spec.enforce_eager,
                         sharded=True)
    model.model.embed_tokens.lockstep = True  # a worker runs nothing but rank 0's lockstep forwards
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    report({"event": "ready", "rank": rank, "pid": os.getpid(), "param_bytes": param_bytes,
            "kv_bytes": runner.kv_cache.nbytes()})
    store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, is_master=False,
                          timeout=timedelta(seconds=spec.timeout_s))
    control = join_group(spec, rank, store)
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0, group=control)
        if message[0] is None:
            break
        runner.run(message[0])
    dist.destroy_process_group()
