"""`TensorParallelRunner`: rank 0's `ModelRunner`, driving ranks 1..N-1 in lockstep.

Rank 0 owns the scheduler, block manager and decoders; every rank holds the KV
cache of its own heads under the same block tables. A step is: build the
attention metadata locally (a bad item is still a per-request ValueError,
before any rank is told), broadcast the step's `ForwardItem`s, run the same
forward on every rank. Every rank ends with the full logits of the asked rows
(`ParallelLMHead`), so the decoders see exactly what one process would.
"""

from __future__ import annotations

import torch

from ...model import QwenForCausalLM
from ..runner import ForwardItem, ForwardOutput, ModelRunner
from .launcher import WorkerGroup
from .sharding import lockstep
from .worker import WorkerSpec

DEFAULT_TIMEOUT_S = 600.0


def rank_devices(device: torch.device, world_size: int) -> list[torch.device]:
    """Device of each rank: cpu for all, or consecutive GPUs from `device`'s index.

    Raises:
        ValueError: fewer visible GPUs than ranks (names both numbers).
    """
    if device.type != "cuda":
        return [device] * world_size
    first = device.index or 0
    count = torch.cuda.device_count()
    if first + world_size > count:
        raise ValueError(f"tensor_parallel_size={world_size} needs GPUs cuda:{first}..cuda:{first + world_size - 1}; "
                         f"{count} visible")
    return [torch.device("cuda", first + r) for r in range(world_size)]


class TensorParallelRunner(ModelRunner):
    """A `ModelRunner` over rank 0's shard that starts and drives the other ranks.

    Args:
        model: rank 0's shard (`load_model_shard(..., rank=0, world_size=N)`).
        num_blocks, block_size, fast_path, enforce_eager: as `ModelRunner`; every rank allocates the
            same blocks and runs the same (eager or compiled) forward.
        model_path, dtype: what the workers load.
        devices: one per rank (`rank_devices`).
        timeout_s: limit of one collective of a forward.

    Raises:
        ValueError / RuntimeError: from `WorkerGroup` (no worker is left running).
    """

    def __init__(self, model: QwenForCausalLM, num_blocks: int, block_size: int, fast_path: bool, *,
                 model_path: str, dtype: str, devices: list[torch.device], enforce_eager: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(model, num_blocks, block_size, fast_path, enforce_eager=enforce_eager, sharded=True)
        spec = WorkerSpec(model=str(model_path), dtype=dtype, devices=[str(d) for d in devices],
                          num_blocks=num_blocks, block_size=block_size, fast_path=fast_path, port=0,
                          num_threads=torch.get_num_threads(), timeout_s=timeout_s, enforce_eager=enforce_eager)
        self.workers = WorkerGroup(spec)

    def run(self, items: list[ForwardItem]) -> list[ForwardOutput]:
        """One forward on every rank; outputs align with `items`.

        Raises:
            ValueError: a bad item (no rank has run anything).
            EngineDeadError: a rank died or failed; every rank has been stopped.
        """
        batch = self.prepare(items)
        self.workers.begin_step(items)
        try:
            with lockstep(self.model):
                out = self.execute(items, batch)
        except BaseException as err:  # the ranks may be mid-collective: the group cannot continue
            dead = self.workers.fail(err)
            if isinstance(err, Exception):
                raise dead from err
            raise  # KeyboardInterrupt / SystemExit stay what they are, the workers stopped
        self.workers.end_step()
        return out

    def rank_param_bytes(self) -> list[int]:
        """Bytes of parameters held by each rank (rank 0 first)."""
        own = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return [own] + [self.workers.ready[r]["param_bytes"] for r in sorted(self.workers.ready)]

    def close(self) -> None:
        """Stop the other ranks and leave the process group (idempotent)."""
        self.workers.close()
