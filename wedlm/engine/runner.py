"""Runs one batched forward over the paged KV cache and returns logits per sequence.

The engine hands over one `ForwardItem` per scheduled sequence: the token ids
and logical positions it feeds (uncached committed tokens, then its window
reordered filled-first, paper section 4.1), its block table and cached length,
and the rows whose logits it needs. The runner flattens them into one
[num_tokens] forward, builds the `PagedAttention` metadata, asks the model for
logits only at the needed rows, and splits them back. Greedy ids for every
row come with the logits in one host transfer (the common case needs nothing
else, so a greedy AR step costs a single device sync).

With `enforce_eager=False` the forward is `compiled.CompiledForward` and every
size of the step is padded up to a shape bucket (`buckets.py`): padded tokens
write their K/V into a scratch block past the engine's blocks (`pad_slot`) and
are nobody's query; padded logit rows are dropped. Eager runs unpadded, and so does a
compiled CPU step of one token of one sequence (`ar` at batch 1: its keys too, with no mask);
a compiled CPU step whose matmuls run on column panels pads neither keys nor logit rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import KVCache, Padding, PagedAttention, QwenForCausalLM, SequenceSlice, as_tensor
from .buckets import StepShape
from .compiled import CompiledForward, forward_logits
from .fast_model import (
    bf16_panels_refusal,
    optimize_for_inference,
    plain_weights,
    precast_for_autocast,
    use_native_ops,
    use_onednn_linear,
    use_panel_weights,
    use_transposed_gemv,
)
from .quantize import is_int8
from .sampling import RowScores, SoftmaxRows


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
    """Logits of one item: float [len(logit_rows), vocab], their argmax ids and their softmax
    and entropy (computed for the whole batch at once on first use; None without logits)."""

    logits: torch.Tensor
    argmax: list[int]
    scores: RowScores | None = None


@dataclass
class PreparedForward:
    """Flat inputs of one forward: int64 [num_tokens] ids and positions, the paged-attention
    metadata, int64 [padded rows] logit rows (None when no item asks for logits on the eager
    path) and the number of real rows (the first `num_rows` of the output)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: PagedAttention
    logit_rows: torch.Tensor | None
    num_rows: int = 0


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
        enforce_eager: run `forward_logits` eagerly (the reference); False = `CompiledForward`
            on bucket-padded inputs.
        autocast: run the model under torch.autocast with this dtype (bf16 on a CPU with
            bf16 matrix units); None = the weights' dtype.
        sharded: `model` is one tensor-parallel rank's shard (`parallel/`); its compiled
            forward then holds the collectives.
        onednn_linear: float32 matmuls by oneDNN on prepacked weights (`fast_model.PACKED_MIN_MACS`)
            (`fast_model.use_onednn_linear`; with `fast_path` only).
        bf16_weights: every matmul on bf16 panels of its weight with float32 activations
            (`fast_model.bf16_weight_linear`; the engine's `quantization="bf16"`), eager or compiled.

    With `fast_path`, no autocast and not `sharded`, a float32 CPU model's one-row matmuls run on
    transposed weight copies (`fast_model.use_transposed_gemv`; `transposed_gemv` says whether).
    A compiled CPU forward of one process calls the engine's C++ operators (`native.py`;
    `native_ops` says whether they loaded). `rows_alone` says whether every kernel of that graph
    computes each row alone (matmuls on column panels or int8, the C++ attention): one sequence's
    tokens, its keys and the logit rows then run unpadded, with the same bits (`StepShape.of`).
    """

    def __init__(self, model: QwenForCausalLM, num_blocks: int, block_size: int, fast_path: bool = True,
                 enforce_eager: bool = True, autocast: torch.dtype | None = None, sharded: bool = False,
                 onednn_linear: bool = False, bf16_weights: bool = False) -> None:
        cfg = model.config
        self.model = optimize_for_inference(model) if fast_path else model
        if fast_path and autocast is not None:  # no per-forward weight casts (fast_model.py)
            precast_for_autocast(self.model, autocast)
        if fast_path and onednn_linear and autocast is None:
            use_onednn_linear(self.model)
        # one-row float32 matmuls on transposed weight copies (CPU, one process, no autocast)
        self.transposed_gemv = (fast_path and autocast is None and not sharded and not bf16_weights
                                and use_transposed_gemv(self.model))
        one_cpu_process = model.device.type == "cpu" and not sharded
        # the compiled graph's float32 matmuls and attention by the engine's C++ operators (`native.py`)
        self.native_ops = not enforce_eager and one_cpu_process and use_native_ops()
        # bf16 matmuls (autocast's or bf16 weights') run on bf16 panels eagerly too: oneDNN's few-row
        # bf16 products were the slowest part of an eager bf16 step (SmolLM2-135M, one Xeon thread:
        # 50 ms a token against 27 on the panels); float32 eager stays BLAS, the reference
        eager_bf16_panels = (enforce_eager and one_cpu_process and fast_path
                             and (autocast == torch.bfloat16 or bf16_weights) and use_native_ops())
        # their few-row matmuls on column-panel copies of the weights (`few_rows_mm`)
        self.panel_weights = ((self.native_ops or eager_bf16_panels) and fast_path
                              and use_panel_weights(self.model, bf16=bf16_weights))
        if bf16_weights and not self.panel_weights:
            refusal = bf16_panels_refusal(self.model)
            raise ValueError(f"quantization='bf16' needs {refusal}" if refusal else
                             "quantization='bf16' needs a CPU with AVX512-BF16, the engine's C++ operators "
                             "(a C++ compiler), one process and fast_path")
        # the causal mask as prefix lengths, which the C++ window attention reads (float32 graphs)
        self.key_ends = self.native_ops and autocast is None and model.dtype == torch.float32
        # every kernel of the compiled graph computes a row alone, whatever the row count: the matmuls
        # on column panels, or int8 products (exact integer sums), beside the C++ attention
        self.rows_alone = self.panel_weights or (self.key_ends and is_int8(self.model))
        # with them, one sequence's step inputs come from one C++ call (`_prepare_one`)
        self.one_call_inputs = self.key_ends
        self.device = model.device
        # [MASK] is an input symbol, never an output: its logit column is -inf in every row
        # returned, for every decoder and the AR head. The engine sets its one [MASK] id here.
        self.mask_token_id: int | None = None
        self.autocast = autocast
        # one block more than the engine's: the scratch rows padded tokens write into
        self.kv_cache = KVCache(cfg.num_hidden_layers, num_blocks + 1, block_size, _kv_heads(model),
                                cfg.head_dim, model.dtype, self.device)
        self.pad_slot = num_blocks * block_size
        self.compiled = None if enforce_eager else CompiledForward(self.device, self.kv_cache.k + self.kv_cache.v,
                                                                   collectives=sharded,
                                                                   weights=plain_weights(self.model))

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
        """Flatten the items and build the attention metadata (no model work, no communication);
        padded to shape buckets when compiled.

        Raises:
            ValueError: an item with no tokens or a block table too short.
        """
        ids, pos, rows, slices = [], [], [], []
        offset = max_q = max_kv = 0
        for item in items:
            n = len(item.token_ids)
            ids += item.token_ids
            pos += item.positions
            rows += [offset + r for r in item.logit_rows]
            slices.append(SequenceSlice(item.block_table, item.context_len, n))
            offset += n
            max_q, max_kv = max(max_q, n), max(max_kv, item.context_len + n)
        num_rows, pad = len(rows), None
        if self.compiled is not None and offset > 0:
            # tokens, keys and logit rows unpadded where every kernel computes a row alone (`StepShape.of`)
            shape = StepShape.of(offset, len(items), max_q, max_kv, num_rows, exact=self.rows_alone)
            # one token of one sequence on a CPU (no CUDA graph wants a fixed key count): built
            # unpadded, as in eager mode, so SDPA runs over exactly the real keys with no mask
            # (docs/engine.md, "Compiled forward")
            one_token = shape.batch == shape.queries == 1 and self.device.type == "cpu"
            if not one_token:
                pad = Padding(shape.tokens, shape.batch, shape.queries, shape.keys, self.pad_slot)
            item = items[0]
            if (self.one_call_inputs and len(items) == 1 and shape.tokens == shape.queries
                    and len(item.block_table) * self.kv_cache.block_size >= offset + item.context_len):
                return self._prepare_one(item, shape, num_rows, one_token)
            ids += [0] * (shape.tokens - offset)
            pos += [0] * (shape.tokens - offset)
            rows += [0] * (shape.rows - num_rows)
        device = self.device
        attn = PagedAttention.build(self.kv_cache, slices, device, pad, key_ends=self.key_ends)
        rows_t = as_tensor(rows, device) if rows else None
        return PreparedForward(as_tensor(ids, device), as_tensor(pos, device), attn, rows_t, num_rows)

    def _prepare_one(self, item: ForwardItem, shape: StepShape, num_rows: int,
                     one_token: bool = False) -> PreparedForward:
        """`prepare` of one sequence for a compiled CPU graph over the engine's C++ attention, whose
        padded tokens are its padded queries: every input in one call of the C++ operator
        `wedlm_cpu::step_inputs`, the same values as the numpy build of `PagedAttention.build`,
        whose fifteen-odd numpy calls a step each run in caches the weights' stream has swept.
        `one_token`: one token (batch-1 `ar`), built unpadded with no visibility to pass, as the
        numpy build leaves it: exactly its keys, no prefix lengths."""
        keys = item.context_len + 1 if one_token else shape.keys
        ids, pos, rows, slots, kv_slots, key_ends = torch.ops.wedlm_cpu.step_inputs(
            item.token_ids, item.positions, item.logit_rows, item.block_table, item.context_len,
            self.kv_cache.block_size, shape.tokens, keys, shape.rows, self.pad_slot)
        attn = PagedAttention(self.kv_cache, slots, kv_slots, None, None, None, None if one_token else key_ends)
        return PreparedForward(ids, pos, attn, rows, num_rows)

    @torch.inference_mode()
    def execute(self, items: list[ForwardItem], batch: PreparedForward) -> list[ForwardOutput]:
        """The forward of `prepare(items)`: K/V into the cache, logits at the asked rows."""
        if batch.logit_rows is None:
            with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16,
                                enabled=self.autocast is not None):
                self.model.hidden_states(batch.input_ids, batch.positions, batch.attn)
            return [ForwardOutput(torch.empty(0), []) for _ in items]
        forward = self.compiled or forward_logits
        logits, argmax = forward(self.model, batch.input_ids, batch.positions, batch.attn, batch.logit_rows,
                                 self.mask_token_id, self.autocast)
        if logits.shape[0] != batch.num_rows:  # padded rows (unpadded ones need no slicing op)
            logits, argmax = logits[:batch.num_rows], argmax[:batch.num_rows]
        ids = argmax.tolist()
        batch_scores = SoftmaxRows(logits, estimate=self.native_ops)
        out, start = [], 0
        for item in items:
            n = len(item.logit_rows)
            out.append(ForwardOutput(logits[start:start + n], ids[start:start + n],
                                     RowScores(batch_scores, start, start + n)))
            start += n
        return out


def _kv_heads(model: QwenForCausalLM) -> int:
    """KV heads the model's attention computes (fewer than the config's on a tensor-parallel rank)."""
    return model.model.layers[0].self_attn.num_kv_heads
