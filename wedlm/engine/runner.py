"""Runs one batched forward over the paged KV cache and returns logits per sequence.

The engine hands over one `ForwardItem` per scheduled sequence: the token ids
and logical positions it feeds (uncached committed tokens, then its window
reordered filled-first, paper section 4.1), its block table and cached length,
and the rows whose logits it needs. The runner flattens them into one
[num_tokens] forward, builds the `PagedAttention` metadata, asks the model for
logits only at the needed rows, and splits them back. Greedy ids for every
row come with the logits in one host transfer (the common case needs nothing
else, so a greedy AR step costs a single device sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import KVCache, PagedAttention, QwenForCausalLM, SequenceSlice
from .fast_model import optimize_for_inference


@dataclass
class ForwardItem:
    """One sequence's part of a forward.

    Attributes:
        token_ids: ids fed, in physical order.
        positions: their logical positions (RoPE phases).
        block_table: the sequence's physical blocks.
        context_len: rows already cached; the fed tokens take the next rows.
        logit_rows: indices into `token_ids` whose logits are returned, in order.
    """

    token_ids: list[int]
    positions: list[int]
    block_table: list[int]
    context_len: int
    logit_rows: list[int]


@dataclass
class ForwardOutput:
    """Logits of one item: float [len(logit_rows), vocab] and their argmax ids."""

    logits: torch.Tensor
    argmax: list[int]


@dataclass
class PreparedForward:
    """Flat inputs of one forward: int64 [num_tokens] ids and positions, the paged-attention
    metadata, and int64 [num_rows] logit rows (None when no item asks for logits)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: PagedAttention
    logit_rows: torch.Tensor | None


class EngineDeadError(RuntimeError):
    """The runner can run no further forward (a tensor-parallel rank died or failed);
    the engine must be rebuilt. Raised out of `Engine.step`, never turned into a request error."""


class ModelRunner:
    """Owns the model and its KV cache.

    Args:
        model: the loaded causal LM (eval mode).
        num_blocks: KV blocks to allocate.
        block_size: rows per block.
        fast_path: swap in fused modules (`fast_model.optimize_for_inference`).
    """

    def __init__(self, model: QwenForCausalLM, num_blocks: int, block_size: int, fast_path: bool = True) -> None:
        cfg = model.config
        self.model = optimize_for_inference(model) if fast_path else model
        self.device = model.device
        # [MASK] is an input symbol, never an output: its logit column is -inf in every row
        # returned, for every decoder and the AR head. The engine sets its one [MASK] id here.
        self.mask_token_id: int | None = None
        self.kv_cache = KVCache(cfg.num_hidden_layers, num_blocks, block_size, _kv_heads(model),
                                cfg.head_dim, model.dtype, self.device)

    @staticmethod
    def kv_bytes_per_block(model: QwenForCausalLM, block_size: int) -> int:
        """Bytes of one KV block of this model (of this rank's KV heads under tensor parallelism)."""
        cfg = model.config
        elem = torch.empty((), dtype=model.dtype).element_size()
        return 2 * cfg.num_hidden_layers * block_size * _kv_heads(model) * cfg.head_dim * elem

    def close(self) -> None:
        """Release resources held outside this object (nothing for one process)."""

    def run(self, items: list[ForwardItem]) -> list[ForwardOutput]:
        """One forward over all items; outputs align with `items`.

        Raises:
            ValueError: an item with no tokens or a block table too short.
        """
        return self.execute(items, self.prepare(items))

    def prepare(self, items: list[ForwardItem]) -> PreparedForward:
        """Flatten the items and build the attention metadata (no model work, no communication).

        Raises:
            ValueError: an item with no tokens or a block table too short.
        """
        ids, pos, rows, slices = [], [], [], []
        offset = 0
        for item in items:
            ids.extend(item.token_ids)
            pos.extend(item.positions)
            rows.extend(offset + r for r in item.logit_rows)
            slices.append(SequenceSlice(item.block_table, item.context_len, len(item.token_ids)))
            offset += len(item.token_ids)
        device = self.device
        input_ids = torch.tensor(ids, dtype=torch.int64, device=device)
        positions = torch.tensor(pos, dtype=torch.int64, device=device)
        attn = PagedAttention.build(self.kv_cache, slices, device)
        rows_t = torch.tensor(rows, dtype=torch.int64, device=device) if rows else None
        return PreparedForward(input_ids, positions, attn, rows_t)

    @torch.inference_mode()
    def execute(self, items: list[ForwardItem], batch: PreparedForward) -> list[ForwardOutput]:
        """The forward of `prepare(items)`: K/V into the cache, logits at the asked rows."""
        if batch.logit_rows is None:
            self.model.hidden_states(batch.input_ids, batch.positions, batch.attn)
            return [ForwardOutput(torch.empty(0), []) for _ in items]
        logits = self.model(batch.input_ids, batch.positions, batch.attn, batch.logit_rows)
        if self.mask_token_id is not None:
            logits[:, self.mask_token_id] = float("-inf")
        argmax = logits.argmax(-1).tolist()
        out, start = [], 0
        for item in items:
            n = len(item.logit_rows)
            out.append(ForwardOutput(logits[start:start + n], argmax[start:start + n]))
            start += n
        return out


def _kv_heads(model: QwenForCausalLM) -> int:
    """KV heads the model's attention computes (fewer than the config's on a tensor-parallel rank)."""
    return model.model.layers[0].self_attn.num_kv_heads
