"""The step loop: Scheduler -> Runner -> Decoder.update -> stream deltas.

One `step()` is one batched forward. For every scheduled sequence the engine
feeds its uncached committed tokens (prompt on the first step, recomputed
tokens after a preemption, the AR anchor) followed by its decoder's window,
then lets the decoder turn the logits into committed tokens (`commit.py`
applies them and builds the deltas). Cache rows that the decoder reports valid
are adopted without recompute, and full committed blocks enter the prefix
cache. Request intake (checks, the new `Sequence`) lives in `intake.py`.

Counting (docs/method.md, "Metrics"; paper section 3.1, Eq. 4): a decode
forward is any forward whose logits a request reads (the first one shares its
forward with the prefill); fed tokens are the window slots plus every fed
token at a position >= the prompt length, plus the last prompt token when its
AR logits are read.
"""

from __future__ import annotations

import itertools
import logging
import random
import time

from ..hardware import process_allocator
from ..tokenizer import load_tokenizer, mask_token_id, stop_token_ids
from .block_manager import BlockManager
from .buckets import FEW_ROWS_MAX
from .commit import commit_tokens, final_delta, progress_delta
from .config import (
    EngineConfig,
    auto_bf16_weights,
    resolve_cpu_linear,
    resolve_device,
    resolve_dtype,
    resolve_enforce_eager,
    resolve_max_model_len,
    resolve_num_blocks,
    resolve_precision,
)
from .decoders import DECODER_CLASSES, Decoder, WindowPlan
from .decoders.verified import window_for_load
from .defaults import VERIFIED_TOKEN_BUDGET, model_decoding_defaults
from .errors import RequestError
from .intake import check_fits, encode_prompt, new_sequence, resolve_params
from .logits_processors import apply_controls
from .logprobs import prompt_logprobs, record, take
from .outputs import StreamDelta, TokenLogprob
from .parallel.build import load_engine_model, make_engine_runner
from .quantize import check_quantization, int8_matmuls
from .request import Sequence
from .runner import EngineDeadError, ForwardItem, ForwardOutput, ModelRunner
from .sampling import make_generator
from .scheduler import ScheduledSeq, Scheduler
from .structured import backend_for

log = logging.getLogger("wedlm.engine")


class Engine:
    """Owns the model, KV cache, scheduler and decoders. Not thread-safe.

    Raises (at construction):
        FileNotFoundError / ConfigError / CheckpointError: from the loader.
        ValueError: inconsistent sizes, naming the field; a bad generation_config.json
            value, naming the file and key.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_path = str(config.model)
        self.model_defaults = model_decoding_defaults(config.model)
        self.window_size = config.window_size or self.model_defaults["wedlm_window_size"]
        self.verified_token_budget = config.verified_token_budget or VERIFIED_TOKEN_BUDGET
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        check_quantization(config.quantization, device, dtype)
        self.model = load_engine_model(config, device, dtype)
        cfg = self.model.config
        # tensor-parallel ranks and quantized weights run without autocast; self.precision: what the forward computes in
        requested = False if config.tensor_parallel_size > 1 or config.quantization else config.autocast
        autocast, self.precision = resolve_precision(requested, device, dtype, hidden_size=cfg.hidden_size)
        # self.quantization: the resolved option; automatic bf16 on a CPU whose bf16 panels run is
        # bf16 weights with float32 activations, not autocast (`auto_bf16_weights`)
        self.quantization = config.quantization
        if auto_bf16_weights(config, autocast, self.model):
            autocast, self.quantization = None, "bf16"
        # self.matmuls: which kernel runs the float32 matmuls, and why
        onednn_linear, self.matmuls = resolve_cpu_linear(device, dtype, autocast, config.tensor_parallel_size)
        if self.quantization == "int8":
            onednn_linear, self.matmuls = False, int8_matmuls()
            self.precision = "float32 weights quantized to int8 per output channel, int8 activations per row"
        elif self.quantization == "bf16":
            onednn_linear, self.matmuls = False, "bf16 matmuls on bf16 column panels (float32 sums and outputs)"
            why = "" if config.quantization else self.precision[self.precision.index(" ("):]
            self.precision = f"float32 weights rounded to bf16 for the matmuls, float32 activations{why}"
        try:
            self.tokenizer = load_tokenizer(config.model)
        except FileNotFoundError:
            self.tokenizer = None
        self.stop_ids = stop_token_ids(self.tokenizer, config.model)
        self.mask_token_id = mask_token_id(self.tokenizer, cfg.mask_token_id)
        self.model_defaults["decoding"] = "ar" if self.mask_token_id is None else "wedlm"
        self.max_model_len = resolve_max_model_len(config.max_model_len, cfg.max_position_embeddings)
        self.max_num_batched_tokens = config.max_num_batched_tokens or max(
            self.max_model_len, 4 * self.window_size + 2)
        bytes_per_block = ModelRunner.kv_bytes_per_block(self.model, config.kv_block_size)
        num_blocks = resolve_num_blocks(config, self.max_model_len, bytes_per_block, device)
        # self.enforce_eager: whether the forward runs eagerly (the resolved option), and why
        self.enforce_eager, why_eager = resolve_enforce_eager(config.enforce_eager, device)
        self.runner = make_engine_runner(self.model, num_blocks, config, device, dtype, autocast, onednn_linear,
                                         enforce_eager=self.enforce_eager, quantization=self.quantization)
        if self.quantization == "bf16":
            pass  # every matmul on bf16 panels: `matmuls` says so
        elif getattr(self.runner, "panel_weights", False):  # the panels replaced the transposed copies
            self.matmuls += (f"; compiled matmuls of 1 to {FEW_ROWS_MAX} rows on column panels" if self.runner.native_ops
                             else "; eager few-row bf16 matmuls on bf16 column panels")
        elif getattr(self.runner, "transposed_gemv", False):
            self.matmuls += "; one-row matmuls on transposed weight copies"
        if getattr(self.runner, "native_ops", False):
            self.matmuls += "; the compiled forward's matmuls and attention by the engine's C++ operators"
        log.info("engine: %s, %s on %s, %s forward (enforce_eager=%s: %s)", self.precision, self.matmuls, device,
                 "eager" if self.enforce_eager else "compiled", self.enforce_eager, why_eager)
        if device.type == "cpu" and process_allocator() == "glibc":
            log.info("engine: glibc's malloc; TCMalloc preloaded (LD_PRELOAD=libtcmalloc_minimal.so.4) runs a "
                     "CPU step ~8% faster (docs/engine.md, \"The memory allocator\")")
        self.runner.mask_token_id = self.mask_token_id  # the one [MASK] id, banned from every output
        self.block_manager = BlockManager(num_blocks, config.kv_block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.max_num_batched_tokens)
        self.decoders: dict[str, Decoder] = {n: c(self.mask_token_id) for n, c in DECODER_CLASSES.items()}
        self.seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._rng = random.Random(config.seed)

    # ---- requests ---------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params=None, request_id: str | None = None,
                    stream: bool = True) -> str:
        """Check and queue a request; returns its id.

        Raises:
            RequestError (a ValueError): bad prompt, parameters or sizes; `param` names the
                field and the message its limit (see `intake.py`).
        """
        params = resolve_params(params, self.model_defaults)
        ids = encode_prompt(prompt, self.tokenizer, self.model.config.vocab_size)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.seqs:
            raise RequestError("request_id", f"request_id {request_id!r} is already in use")
        window = params.wedlm_window_size or self.window_size
        self._check(ids, params, window)
        seq = new_sequence(request_id, ids, params, window, self.stop_ids, self.tokenizer, stream)
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = prompt_logprobs(self.model, ids, params.prompt_logprobs, self.mask_token_id,
                                                  getattr(self.runner, "autocast", None))
        if params.structured is not None:
            seq.grammar = self._grammar_state(params, seq.stop_ids)
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            seq.generator = make_generator(seed, self.runner.device)
        self.decoders[params.decoding].init(seq)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def _check(self, ids: list[int], params, window: int) -> None:
        n = len(ids)
        check_fits(n, params.max_tokens, self.max_model_len)
        if DECODER_CLASSES[params.decoding].needs_mask and self.mask_token_id is None:
            raise RequestError("decoding", f"decoding={params.decoding!r} needs a [MASK] token but this "
                                           f"model has no mask_token_id; use decoding='ar'")
        # `ar` feeds no window, so only the decoders that do need room for one in a step
        if DECODER_CLASSES[params.decoding].needs_mask and 2 * window + 1 > self.max_num_batched_tokens:
            most = (self.max_num_batched_tokens - 1) // 2
            raise RequestError("wedlm_window_size", f"wedlm_window_size={window} is above this engine's limit of "
                                                    f"{most}: a step must hold two windows and a token "
                                                    f"(2 * {window} + 1 > max_num_batched_tokens="
                                                    f"{self.max_num_batched_tokens})")
        need = self.block_manager.blocks_for(n + params.max_tokens)
        if need > self.block_manager.num_blocks:
            raise RequestError("max_tokens", f"request needs up to {need} KV blocks (prompt {n} + max_tokens "
                                             f"{params.max_tokens}); the cache has "
                                             f"num_kv_blocks={self.block_manager.num_blocks}")
        vocab = self.model.config.vocab_size
        bad = [t for t in params.logit_bias or {} if t >= vocab]
        if bad:
            raise RequestError("logit_bias", f"logit_bias token ids must be < vocab_size={vocab}, got {bad[0]}")
        bad = [t for t in params.stop_token_ids or () if t >= vocab]
        if bad:  # an id no step can emit: the stop would never match
            raise RequestError("stop_token_ids", f"stop_token_ids must be < vocab_size={vocab}, got {bad[0]}")
        if params.prompt_logprobs is not None and self.config.tensor_parallel_size > 1:
            raise RequestError("prompt_logprobs", "prompt_logprobs needs the whole model in this process; "
                                                  "run with tensor_parallel_size=1")

    def _grammar_state(self, params, stop_ids: frozenset[int]):
        """The matcher of a constrained request (its grammar compiled once per text, `structured.py`).

        Raises:
            RequestError (param "structured"): no tokenizer, no stop id to end the answer with, or
                a grammar the backend cannot compile against this vocabulary; (param
                "structured.<kind>") a grammar that allows no first token (accepts no answer).
        """
        if self.tokenizer is None or not stop_ids:
            raise RequestError("structured", "structured outputs need the model folder's tokenizer and a stop id")
        never = set(self.tokenizer.all_special_ids) | set(stop_ids)  # a stop id only ends the answer,
        # never spells grammar text (the grammar allows it by id where it may end)
        if self.mask_token_id is not None:
            never.add(self.mask_token_id)
        backend = backend_for(self.tokenizer, self.model.config.vocab_size, never)
        try:
            state = backend.state(params.structured, stop_ids)
        except RuntimeError as err:  # the backend refused it against this vocabulary
            raise RequestError("structured", f"structured: cannot compile for this tokenizer: {err}") from None
        if state.stuck():  # refused here: a decoder would otherwise meet a row with no allowed token
            kind = params.structured.kind
            raise RequestError(f"structured.{kind}", f"structured.{kind} accepts no answer this tokenizer "
                                                     "can spell (no token and no stop is allowed first)")
        return state

    def abort(self, request_id: str) -> StreamDelta | None:
        """Stop a request and free its blocks.

        Returns:
            its final delta (finish_reason "abort", `stats` with the prompt tokens,
            generated tokens and forwards it used so far), or None when the id is
            unknown or already finished. This is the only report of the abort:
            `step()` does not repeat it.
        """
        seq = self.seqs.pop(str(request_id), None)
        if seq is None:
            return None
        self.scheduler.finish(seq)
        return _with_logprobs(seq, final_delta(seq, [], "abort", self.tokenizer), [])

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (`BlockManager.reset_prefix_cache`): True when reset, False while
        requests hold KV blocks."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    # ---- the step ---------------------------------------------------------------

    def step(self) -> list[StreamDelta]:
        """One batched forward; one delta per request that committed tokens or finished.

        Raises:
            EngineDeadError: a tensor-parallel rank died or failed; the engine is unusable.
        """
        out = self.scheduler.schedule()
        deltas = [self._fail(seq, f"request needs more KV blocks than the cache has free "
                                  f"({self.block_manager.num_free} of {self.block_manager.num_blocks})")
                  for seq in out.refused]
        if not out.scheduled:
            return deltas
        self._fit_windows(out.scheduled)
        scheduled, plans = [], []
        for s in out.scheduled:
            try:
                plan = self.decoders[s.seq.params.decoding].plan(s.seq) if s.with_window else None
            except Exception as err:  # a decoder that cannot plan fails its request, never the step
                deltas.append(self._fail(s.seq, f"decoder failed to plan its window: {err}"))
                continue
            scheduled.append(s)
            plans.append(plan)
        if not scheduled:
            return deltas
        items = [self._forward_item(s, p) for s, p in zip(scheduled, plans)]
        try:
            results = self.runner.run(items)
        except EngineDeadError:  # a tensor-parallel rank is gone: no request can run any more
            raise
        except Exception as err:  # a failed forward fails its requests, never the engine
            return deltas + [self._fail(s.seq, f"forward failed: {err}") for s in scheduled]
        now = time.perf_counter()
        for item, plan, result in zip(scheduled, plans, results):
            delta = self._apply(item, plan, result, now)
            if delta is not None:
                deltas.append(delta)
        return deltas

    def _fit_windows(self, scheduled: list[ScheduledSeq]) -> None:
        """Let each decoder shrink its window to the step's load (`Decoder.fit_window`: `verified`
        takes `decoders.verified.window_for_load` of the requests that decode in this forward)."""
        decoding = [s.seq for s in scheduled if s.with_window]
        for seq in decoding:
            slots = window_for_load(seq.window_size, len(decoding), self.verified_token_budget)
            self.decoders[seq.params.decoding].fit_window(seq, slots)

    def _forward_item(self, s: ScheduledSeq, plan: WindowPlan | None) -> ForwardItem:
        seq, start = s.seq, s.seq.num_cached
        ids = seq.tokens[start:start + s.num_context]
        pos = list(range(start, start + s.num_context))
        rows: list[int] = []
        if plan is not None:
            if plan.anchor:
                rows.append(s.num_context - 1)
            rows.extend(s.num_context + r for r in plan.logit_rows)
            ids = ids + plan.token_ids
            pos = pos + plan.positions
        return ForwardItem(ids, pos, seq.block_table, start, rows)

    def _apply(self, s: ScheduledSeq, plan: WindowPlan | None, result: ForwardOutput,
               now: float) -> StreamDelta | None:
        seq = s.seq
        start = seq.num_cached
        seq.num_cached += s.num_context
        if plan is None:  # a prefill chunk
            self.block_manager.register_full_blocks(seq)
            return None
        stats = seq.stats
        stats.decode_forwards += 1
        stats.fed_tokens += (len(plan.token_ids) + max(0, seq.num_cached - max(start, seq.prompt_len))
                             + (plan.anchor and seq.num_cached - 1 < seq.prompt_len))
        if seq.first_forward_end is None:
            seq.first_forward_end = now
        try:
            new_ids, reason, logprobs = self._decode(seq, plan, result)
        except Exception as err:
            return self._fail(seq, f"decoder failed: {err}")
        stats.commits.append(len(new_ids))
        stats.decode_tokens = seq.num_generated
        if new_ids and stats.ttft_s is None:
            stats.ttft_s = now - seq.arrival_time
        # before a finish frees the blocks: a request that ends in its first decode forward
        # (a short answer, several tokens per forward) still leaves its prompt's blocks reusable
        self.block_manager.register_full_blocks(seq)
        if reason is not None:
            self.seqs.pop(seq.request_id, None)
            self.scheduler.finish(seq)
            stats.decode_time_s = now - seq.first_forward_end
            return _with_logprobs(seq, final_delta(seq, new_ids, reason, self.tokenizer), logprobs)
        seq.step_index += 1
        return _with_logprobs(seq, progress_delta(seq, new_ids), logprobs) if new_ids else None

    def _decode(self, seq: Sequence, plan: WindowPlan,
                result: ForwardOutput) -> tuple[list[int], str | None, list[TokenLogprob] | None]:
        """The decoder's update on the (controlled) logits, then the commit: (new ids, finish reason,
        their logprobs when asked for)."""
        params, decoder = seq.params, self.decoders[seq.params.decoding]
        logits, argmax, scores = result.logits, result.argmax, result.scores
        offsets = decoder.row_offsets(seq, plan) if params.has_logit_controls or params.logprobs is not None else []
        if params.has_logit_controls:
            logits = apply_controls(seq, logits, offsets)
            argmax, scores = logits.argmax(-1).tolist(), None  # the batch-wide softmax is of the raw logits
        before, base = list(seq.window), len(seq.tokens)
        step = decoder.update(seq, plan, logits, argmax, scores)
        if params.logprobs is not None:
            record(seq, decoder.logprob_rows, logits, offsets, before, base, step.committed)
        new_ids, reason = commit_tokens(seq, step.committed, step.num_valid)
        return new_ids, reason, take(seq, base, len(new_ids)) if params.logprobs is not None else None

    def _fail(self, seq: Sequence, message: str) -> StreamDelta:
        """End a request whose forward or decoder failed: finish_reason "abort", `error` set."""
        seq.error = message
        self.seqs.pop(seq.request_id, None)
        self.scheduler.finish(seq)
        return _with_logprobs(seq, final_delta(seq, [], "abort", self.tokenizer), [])

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent; also done when collected)."""
        self.runner.close()

    # ---- introspection ----------------------------------------------------------

    def metrics(self) -> dict:
        bm = self.block_manager
        return {
            "num_waiting": len(self.scheduler.waiting),
            "num_running": len(self.scheduler.running),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_free": bm.num_free,
            "kv_blocks_used": bm.num_blocks - bm.num_free,
            "prefix_cache_hit_tokens": bm.hit_tokens,
            "prefix_cache_queries": bm.query_tokens,
        }


def _with_logprobs(seq: Sequence, delta: StreamDelta, logprobs: list[TokenLogprob] | None) -> StreamDelta:
    """`delta` carrying its tokens' logprobs (requests that asked), and the prompt's on the first delta."""
    if seq.params.logprobs is not None:
        delta.logprobs = logprobs if logprobs is not None else []
    if seq.prompt_logprobs is not None:
        delta.prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
    return delta
