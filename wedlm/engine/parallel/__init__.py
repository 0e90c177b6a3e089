"""Tensor-parallel inference over torch.distributed (NCCL on CUDA, gloo on CPU).

`LLM(model, tensor_parallel_size=N)` splits the weights Megatron-style across N
ranks (`sharding.py`), each rank reading only its slices of the checkpoint
(`loading.py`). Rank 0 is the caller's process and keeps the scheduler, block
manager and decoders; ranks 1..N-1 are child processes that run the same
forwards on the step inputs rank 0 broadcasts (`launcher.py`, `worker.py`,
`runner.py`). docs/engine.md has the sharding table and the process model.
"""

from .loading import load_model_shard
from .runner import TensorParallelRunner, rank_devices
from .sharding import check_tensor_parallel_size, shard_model, shard_slice

__all__ = ["TensorParallelRunner", "check_tensor_parallel_size", "load_model_shard", "rank_devices",
           "shard_model", "shard_slice"]
