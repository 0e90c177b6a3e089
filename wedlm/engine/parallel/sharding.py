"""Megatron-style tensor parallelism for the Qwen/Llama-family decoder, applied by swapping modules.

The model stays plain PyTorch (`wedlm/model/qwen.py`); `shard_model` narrows
its weights to one rank's slice and swaps the few modules that must talk to the
other ranks, in the manner of gpt-fast:

| weight | split | communication |
|---|---|---|
| `embed_tokens` | rows (vocabulary) | all-reduce of the looked-up rows |
| `q_proj` (+ bias) | rows, by query head | none (column-parallel) |
| `k_proj`, `v_proj` (+ bias) | rows, by KV head; replicated when KV heads < ranks | none |
| `q_norm`, `k_norm`, layer norms, final norm | replicated | none |
| `o_proj` (bias replicated) | columns, by query head | all-reduce (row-parallel) |
| `gate_proj`, `up_proj` (+ bias) | rows (intermediate) | none (column-parallel) |
| `down_proj` (bias replicated) | columns (intermediate) | all-reduce (row-parallel) |
| `lm_head` (tied or not) | rows (vocabulary) | all-gather of the asked-for rows' logits |

So a decoder layer costs two all-reduces, and every rank ends a forward with
the full logits of the rows the decoder asked for. The collectives are torch's
functional ones (`torch.distributed._functional_collectives`: they return a new
tensor instead of writing in place), which `torch.compile` traces into its graph,
so the compiled forward (`enforce_eager=False`) runs sharded as well. `shard_slice` is the one
table both the swap and the per-rank checkpoint reader (`loading.py`) use.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

from ...model import ModelConfig, QwenForCausalLM
from ...model.layers import SwiGLU
from ...model.qwen import Attention


def check_tensor_parallel_size(config: ModelConfig, size: int) -> None:
    """Raise ValueError unless `size` ranks can split this model.

    Query heads, the intermediate size and the vocabulary must divide by `size`;
    KV heads must divide by it or divide it (then each KV head is replicated on
    `size / num_key_value_heads` ranks). The message names both numbers.
    """
    if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {size!r}")
    for name in ("num_attention_heads", "intermediate_size", "vocab_size"):
        value = getattr(config, name)
        if value % size:
            raise ValueError(f"{name}={value} is not divisible by tensor_parallel_size={size}")
    kv = config.num_key_value_heads
    if kv % size and size % kv:
        raise ValueError(f"num_key_value_heads={kv} neither divides nor is divisible by "
                         f"tensor_parallel_size={size}")


@dataclass(frozen=True, slots=True)
class ShardSlice:
    """The part of a full checkpoint tensor one rank holds: indices [start, stop) along `dim`."""

    dim: int
    start: int
    stop: int


def local_kv_heads(config: ModelConfig, world_size: int) -> int:
    """KV heads held per rank (1 when KV heads are replicated)."""
    return max(1, config.num_key_value_heads // world_size)


def shard_slice(name: str, config: ModelConfig, rank: int, world_size: int) -> ShardSlice | None:
    """The slice of checkpoint tensor `name` that `rank` holds; None = replicated (whole tensor)."""
    parts = name.split(".")
    module, kind = parts[-2] if len(parts) > 1 else "", parts[-1]
    d = config.head_dim
    if kind == "bias" and module in ("o_proj", "down_proj"):
        return None  # a row-parallel layer adds its whole bias once, after the all-reduce
    if module == "q_proj" or module == "o_proj":
        n = config.num_attention_heads // world_size
        start, stop = rank * n * d, (rank + 1) * n * d
        return ShardSlice(0 if module == "q_proj" else 1, start, stop)
    if module in ("k_proj", "v_proj"):
        n = local_kv_heads(config, world_size)
        first = rank * n if config.num_key_value_heads >= world_size else \
            rank // (world_size // config.num_key_value_heads)
        return ShardSlice(0, first * d, (first + n) * d)
    if module in ("gate_proj", "up_proj", "down_proj"):
        n = config.intermediate_size // world_size
        return ShardSlice(0 if module != "down_proj" else 1, rank * n, (rank + 1) * n)
    if module in ("embed_tokens", "lm_head") and kind == "weight":
        n = config.vocab_size // world_size
        return ShardSlice(0, rank * n, (rank + 1) * n)
    return None


class RowParallelLinear(nn.Linear):
    """Holds input columns [start, stop) of the full weight; all-reduces the partial products.

    forward: x float [..., in_features / world] -> [..., out_features] (the full output on every rank).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Holds rows [vocab_start, vocab_start + num_embeddings) of the embedding table.

    forward: ids int64 [...] (full vocabulary) -> float [..., hidden]; a rank
    contributes zeros for ids outside its rows and the all-reduce adds the owner's row,
    so the result is exact.
    """

    vocab_start: int = 0
    lockstep: bool = False  # True while every rank runs this forward (see `lockstep`)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.lockstep:
            raise RuntimeError("this is one rank's shard of a tensor-parallel model: it runs forwards only in "
                               "lockstep with the other ranks, through the engine's runner (a direct call would "
                               "wait in its first all-reduce)")
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return _all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Linear):
    """Holds vocabulary rows of the LM head; gathers the full logits on every rank.

    forward: x float [n, hidden] (only the rows whose logits were asked for) ->
    [n, vocab_size], identical on every rank (no arithmetic crosses ranks, so it is
    exact).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight).contiguous()
        world = dist.get_world_size()
        stacked = funcol.all_gather_single(local, 0, dist.group.WORLD)  # [world * n, V / world]
        return torch.cat(torch.chunk(stacked, world, dim=0), dim=-1)


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over every rank of the default group (functional: a new tensor)."""
    return funcol.all_reduce(t, "sum", dist.group.WORLD)


@contextmanager
def lockstep(model: QwenForCausalLM) -> Iterator[None]:
    """Allow forwards of a sharded model inside the block (every rank runs the same forward)."""
    embed = model.model.embed_tokens
    embed.lockstep = True
    try:
        yield
    finally:
        embed.lockstep = False


def _narrow(param: nn.Parameter, piece: ShardSlice | None) -> nn.Parameter:
    if piece is None:
        return param
    return nn.Parameter(param.detach().narrow(piece.dim, piece.start, piece.stop - piece.start),
                        requires_grad=False)


def shard_model(model: QwenForCausalLM, rank: int, world_size: int) -> QwenForCausalLM:
    """Narrow every weight to `rank`'s slice and swap in the parallel modules (in place).

    Works on a meta-device model (the loader then assigns the slices it read) or on a
    loaded one (the slices are views of the full weights). Query/KV head counts of
    the attention modules become per-rank counts. Apply before
    `optimize_for_inference`. The forward needs an initialised default
    `torch.distributed` process group of `world_size` ranks.

    Raises:
        ValueError: `world_size` cannot split the model (`check_tensor_parallel_size`).
    """
    config = model.config
    check_tensor_parallel_size(config, world_size)
    if world_size == 1:
        return model
    for name, module in model.named_modules():
        for pname, param in list(module._parameters.items()):
            if param is not None:
                full = f"{name}.{pname}" if name else pname
                setattr(module, pname, _narrow(param, shard_slice(full, config, rank, world_size)))
        if isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape
        if isinstance(module, Attention):
            module.num_heads = config.num_attention_heads // world_size
            module.num_kv_heads = local_kv_heads(config, world_size)
            module.o_proj.__class__ = RowParallelLinear
        elif isinstance(module, SwiGLU):
            module.down_proj.__class__ = RowParallelLinear
    embed = model.model.embed_tokens
    embed.__class__ = VocabParallelEmbedding
    embed.num_embeddings = embed.weight.shape[0]
    embed.vocab_start = rank * embed.num_embeddings
    model.lm_head.__class__ = ParallelLMHead
    if config.tie_word_embeddings:
        model.lm_head.weight = embed.weight
    return model
