"""The step loop: Scheduler -> Runner -> Decoder.update -> stream deltas.

One `step()` is one batched forward. For every scheduled sequence the engine
feeds its uncached committed tokens (prompt on the first step, recomputed
tokens after a preemption, the AR anchor) followed by its decoder's window,
then lets the decoder turn the logits into committed tokens. Commits are
applied one token at a time so stop ids, stop strings and the length limit
cut at exactly the right token; cache rows that the decoder reports valid are
adopted without recompute, and full committed blocks enter the prefix cache.

Counting (paper section 3.1, Eq. 4): a decode forward is any forward whose
logits a request reads (the first one shares its forward with the prefill);
fed tokens are the window slots plus every fed token at a position >= the
prompt length, plus the last prompt token when its AR logits are read.
"""

from __future__ import annotations

import itertools
import numbers
import random
import time

from ..tokenizer import load_tokenizer, mask_token_id, stop_token_ids
from .block_manager import BlockManager
from .config import (EngineConfig, generation_defaults, resolve_device, resolve_max_model_len,
                     resolve_num_blocks, DEFAULT_WINDOW)
from .decoders import DECODER_CLASSES, Decoder, WindowPlan
from .detokenizer import IncrementalDetokenizer
from .outputs import StreamDelta
from .request import Sequence
from .parallel.build import load_engine_model, make_engine_runner
from .runner import EngineDeadError, ForwardItem, ForwardOutput, ModelRunner
from .sampling import make_generator
from .sampling_params import SamplingParams
from .scheduler import ScheduledSeq, Scheduler


class Engine:
    """Owns the model, KV cache, scheduler and decoders. Not thread-safe.

    Raises (at construction):
        FileNotFoundError / ConfigError / CheckpointError: from the loader.
        ValueError: inconsistent sizes, naming the field.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_path = str(config.model)
        device = resolve_device(config.device)
        dtype = config.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        self.model = load_engine_model(config, device, dtype)
        cfg = self.model.config
        try:
            self.tokenizer = load_tokenizer(config.model)
        except FileNotFoundError:
            self.tokenizer = None
        self.stop_ids = stop_token_ids(self.tokenizer, config.model)
        self.mask_token_id = mask_token_id(self.tokenizer, cfg.mask_token_id)
        self.model_defaults = generation_defaults(config.model)
        self.window_size = self._default_window(config)
        self.max_model_len = resolve_max_model_len(config.max_model_len, cfg.max_position_embeddings)
        self.max_num_batched_tokens = config.max_num_batched_tokens or max(
            self.max_model_len, 4 * self.window_size + 2)
        bytes_per_block = ModelRunner.kv_bytes_per_block(self.model, config.kv_block_size)
        num_blocks = resolve_num_blocks(config, self.max_model_len, bytes_per_block, device)
        self.runner = make_engine_runner(self.model, num_blocks, config, device, dtype)
        self.block_manager = BlockManager(num_blocks, config.kv_block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.max_num_batched_tokens)
        self.decoders: dict[str, Decoder] = {n: c(self.mask_token_id) for n, c in DECODER_CLASSES.items()}
        self.seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._rng = random.Random(config.seed)

    def _default_window(self, config: EngineConfig) -> int:
        """W: the engine argument, else generation_config.json's, else 16; the folder's values are
        checked here (a window of 0 would stall every request), naming the file."""
        source = f"{config.model}/generation_config.json"
        try:
            SamplingParams().resolve(self.model_defaults)  # tau and lambda
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
        if config.window_size is not None:
            return config.window_size
        window = self.model_defaults.get("wedlm_window_size", DEFAULT_WINDOW)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"{source}: wedlm_window_size must be an integer >= 1, got {window!r}")
        return window

    # ---- requests ---------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = True) -> str:
        """Validate and queue a request; returns its id.

        Raises:
            ValueError: bad prompt, parameters or sizes; the message names the field and limit.
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params = params.resolve(self.model_defaults)
        ids = self._encode(prompt)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.seqs:
            raise ValueError(f"request_id {request_id!r} is already in use")
        window = params.window_size or self.window_size
        self._validate(ids, params, window)
        seq = Sequence(
            request_id=request_id, tokens=list(ids), prompt_len=len(ids), params=params,
            max_len=len(ids) + min(params.max_tokens, self.max_model_len - len(ids)),
            window_size=window, index=len(self.seqs),
            stop_ids=frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(self.stop_ids)))
        seq.stats.prompt_tokens = len(ids)
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            seq.generator = make_generator(seed, self.runner.device)
        if self.tokenizer is not None and (stream or params.stop_strings):
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.stop_strings)
        self.decoders[params.decoding].init(seq)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is a string but the model folder has no tokenizer; pass token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            try:
                ids = list(prompt)
            except TypeError:
                raise ValueError(f"prompt must be a string or a list of token ids, "
                                 f"got {type(prompt).__name__}") from None
        vocab = self.model.config.vocab_size
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("prompt is empty; it needs at least 1 token")
        return ids

    def _validate(self, ids: list[int], params: SamplingParams, window: int) -> None:
        n, limit = len(ids), self.max_model_len
        if n + 1 > limit:
            raise ValueError(f"prompt has {n} tokens; max_model_len is {limit} and needs "
                             f"at least 1 token for generation")
        if DECODER_CLASSES[params.decoding].needs_mask and self.mask_token_id is None:
            raise ValueError(f"decoding={params.decoding!r} needs a [MASK] token but this model "
                             f"has no mask_token_id; use decoding='ar'")
        if 2 * window + 1 > self.max_num_batched_tokens:
            raise ValueError(f"window_size={window} needs max_num_batched_tokens >= {2 * window + 1}, "
                             f"got {self.max_num_batched_tokens}")
        max_len = n + min(params.max_tokens, limit - n)
        need = self.block_manager.blocks_for(max_len)
        if need > self.block_manager.num_blocks:
            raise ValueError(f"request needs up to {need} KV blocks (prompt {n} + max_tokens "
                             f"{max_len - n}); the cache has num_kv_blocks={self.block_manager.num_blocks}")

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
        return self._final_delta(seq, [], "abort")

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    # ---- the step ---------------------------------------------------------------

    def step(self) -> list[StreamDelta]:
        """One batched forward; one delta per request that committed tokens or finished.

        Raises:
            EngineDeadError: a tensor-parallel rank died or failed; the engine is unusable.
        """
        deltas: list[StreamDelta] = []
        out = self.scheduler.schedule()
        for seq in out.refused:
            deltas.append(self._fail(seq, f"request needs more KV blocks than the cache has free "
                                          f"({self.block_manager.num_free} of {self.block_manager.num_blocks})"))
        if not out.scheduled:
            return deltas
        plans = [self.decoders[s.seq.params.decoding].plan(s.seq) if s.with_window else None
                 for s in out.scheduled]
        items = [self._forward_item(s, p) for s, p in zip(out.scheduled, plans)]
        try:
            results = self.runner.run(items)
        except EngineDeadError:  # a tensor-parallel rank is gone: no request can run any more
            raise
        except Exception as err:  # a failed forward fails its requests, never the engine
            return deltas + [self._fail(s.seq, f"forward failed: {err}") for s in out.scheduled]
        now = time.perf_counter()
        for item, plan, result in zip(out.scheduled, plans, results):
            delta = self._apply(item, plan, result, now)
            if delta is not None:
                deltas.append(delta)
        return deltas

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
            step = self.decoders[seq.params.decoding].update(seq, plan, result.logits, result.argmax)
            new_ids, reason = self._commit(seq, step.committed, step.num_valid)
        except Exception as err:
            return self._fail(seq, f"decoder failed: {err}")
        stats.commits.append(len(new_ids))
        stats.decode_tokens = seq.num_generated
        if new_ids and stats.ttft_s is None:
            stats.ttft_s = now - seq.arrival_time
        if reason is not None:
            self.seqs.pop(seq.request_id, None)
            self.scheduler.finish(seq)
            stats.decode_time_s = now - seq.first_forward_end
            return self._final_delta(seq, new_ids, reason)
        self.block_manager.register_full_blocks(seq)
        seq.step_index += 1
        if not new_ids:
            return None
        text = seq.detokenizer.flush() if seq.detokenizer is not None else ""
        return StreamDelta(seq.request_id, new_ids, text, False, None, seq.step_index - 1)

    def _commit(self, seq: Sequence, committed: list[int], num_valid: int) -> tuple[list[int], str | None]:
        """Append tokens one by one, stopping at a stop id / stop string / the length limit."""
        added, reason = [], None
        detok = seq.detokenizer
        for t in committed:
            seq.tokens.append(t)
            added.append(t)
            if t in seq.stop_ids:
                reason = "stop"
                break
            if detok is not None and detok.add(t) and detok.stopped:
                reason = "stop"
                break
            if len(seq.tokens) >= seq.max_len:
                reason = "length"
                break
        seq.num_cached += min(num_valid, len(added))
        return added, reason

    def _final_delta(self, seq: Sequence, new_ids: list[int], reason: str) -> StreamDelta:
        seq.finish_reason = reason
        if seq.detokenizer is not None:
            text = seq.detokenizer.finish()
        elif self.tokenizer is not None:
            out = seq.output_ids
            if out and out[-1] in seq.stop_ids and reason == "stop":
                out = out[:-1]
            text = self.tokenizer.decode(out)
        else:
            text = ""
        step_index = seq.step_index
        seq.step_index += 1
        return StreamDelta(seq.request_id, new_ids, text, True, reason, step_index,
                           seq.stats.to_dict(), seq.error)

    def _fail(self, seq: Sequence, message: str) -> StreamDelta:
        seq.error = message
        self.seqs.pop(seq.request_id, None)
        self.scheduler.finish(seq)
        return self._final_delta(seq, [], "abort")

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
