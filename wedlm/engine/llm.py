"""`LLM`: the public facade, a drop-in for the official `wedlm` package.

    from wedlm import LLM, SamplingParams
    llm = LLM(model="path/to/checkpoint")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=64))

Besides `generate` / `generate_stream`, the step-level API (`add_request`,
`step`, `abort`, `has_unfinished`, `metrics`) is the contract the OpenAI
server drives from its single loop thread. Not thread-safe.
"""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Iterable, Iterator, Mapping

from ..model.source import resolve_model
from .config import EngineConfig
from .engine import Engine
from .errors import RequestError
from .outputs import StreamDelta
from .sampling_params import SamplingParams

log = logging.getLogger("wedlm.engine")


class LLM:
    """A loaded model with its inference engine.

    Args:
        model: checkpoint folder (config.json, safetensors, tokenizer), a .gguf file or a
            Hugging Face hub id `org/name` (`wedlm.model.source.resolve_model`).
        revision: branch, tag or commit of a hub id (None = "main").
        wedlm_window_size: WeDLM window W (None = generation_config.json's, else 16).
        max_model_len: context limit; None = min(4096, max_position_embeddings).
        max_num_seqs: most concurrent running requests.
        kv_block_size: rows per KV block.
        device, dtype: e.g. "cuda", "bfloat16"; None = cuda+bf16 when available, else cpu+fp32.
        num_kv_blocks, max_num_batched_tokens, enable_prefix_caching,
        gpu_memory_utilization, seed: see `EngineConfig`.
        tensor_parallel_size: split the weights across this many ranks
            (`wedlm.engine.parallel`; ranks 1..N-1 are child processes that live as
            long as this object: `close()`, `with LLM(...) as llm:`, garbage
            collection or interpreter exit stop them).
        enforce_eager: None (default) = automatic: the `torch.compile`d forward on shape
            buckets (CPU inductor; CUDA adds CUDA graphs of decode steps) wherever inductor can
            build kernels (a C++ compiler on a CPU, Triton on CUDA), else eager
            (`engine.config.resolve_enforce_eager`; `engine.enforce_eager` says which ran). The
            first steps of a compiled engine compile (logged with their time), or `warm_up()`
            compiles them at once; the compiled
            graphs are cached on disk (`$TORCHINDUCTOR_CACHE_DIR`, else
            ~/.cache/wedlm/torch-compile), so a later process loads them instead. True runs
            eagerly (the reference path), False forces compiling; tokens are the same either way.
        autocast: bf16 autocast of float32 weights: None = automatic (bf16 for a CPU with native
            bf16 matrix units and hidden size >= 512: bf16 weights with float32 activations where the
            engine's bf16 kernel runs, else autocast; off otherwise; `engine.precision` says which
            ran), True / False force autocast on / off.
        quantization: None (float weights), "int8": int8 activations (per row) x int8 weights (per
            channel) for every matmul (`wedlm.engine.quantize`), or "bf16": bf16 weights with float32
            activations (a CPU with AVX512-BF16); both on the CPU, float32 weights, one process.
        verified_token_budget: rows one forward spends on `verified` windows before each
            request's window shrinks (`decoders.verified.window_for_load`); None = the default, 128.

    Raises:
        ValueError: a bad setting, naming it (a tensor_parallel_size that does not
            divide the model's heads, intermediate size or vocabulary names both
            numbers, before any process starts); loader errors for a bad folder
            (`ModelSourceError`, an OSError, for a model that cannot be found or fetched);
            RuntimeError when a tensor-parallel rank fails to start.
    """

    def __init__(self, model: str, wedlm_window_size: int | None = None, max_model_len: int | None = None,
                 max_num_seqs: int = 64, kv_block_size: int = 16, device: str | None = None,
                 dtype: str | None = None, num_kv_blocks: int | None = None,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = True,
                 gpu_memory_utilization: float = 0.9, seed: int = 0, tensor_parallel_size: int = 1,
                 enforce_eager: bool | None = None, autocast: bool | None = None, revision: str | None = None,
                 quantization: str | None = None, verified_token_budget: int | None = None) -> None:
        self.source = str(model)
        self.engine = Engine(EngineConfig(
            model=str(resolve_model(model, revision)), window_size=wedlm_window_size, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            kv_block_size=kv_block_size, num_kv_blocks=num_kv_blocks, device=device, dtype=dtype,
            enable_prefix_caching=enable_prefix_caching, gpu_memory_utilization=gpu_memory_utilization,
            seed=seed, tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
            autocast=autocast, quantization=quantization, verified_token_budget=verified_token_budget))

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (idempotent)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self):
        """The HF tokenizer of the model folder (None if it has none)."""
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def decoding_defaults(self) -> dict:
        """What a request that sets none of them decodes with: {"wedlm_window_size": W,
        "wedlm_entropy_threshold": tau, "wedlm_pos_penalty_factor": lambda, "wedlm_stop_by_ar":
        bool, "wedlm_stop_in_run": bool} (this engine's W, the model's generation_config.json values, else
        `engine/defaults.py`)."""
        d = self.engine.model_defaults
        return {"wedlm_window_size": self.engine.window_size,
                "wedlm_entropy_threshold": d["wedlm_entropy_threshold"],
                "wedlm_pos_penalty_factor": d["wedlm_pos_penalty_factor"],
                "wedlm_stop_by_ar": d["wedlm_stop_by_ar"], "wedlm_stop_in_run": d["wedlm_stop_in_run"]}

    @property
    def model_path(self) -> str:
        """The model as given: a folder, a .gguf file or a hub id (`engine.model_path`: its folder)."""
        return self.source

    # ---- step-level API (the server's contract) -----------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request (streamed: deltas carry text). Raises ValueError naming the field."""
        return self.engine.add_request(prompt, params, request_id, stream=True)

    def step(self) -> list[StreamDelta]:
        """Run one engine step (one batched forward); one delta per request that progressed."""
        return self.engine.step()

    def abort(self, request_id: str) -> StreamDelta | None:
        """Abort a request and free its KV blocks.

        Returns its final delta (finish_reason "abort", with the request's stats so far),
        or None if it is unknown or already finished; `step()` does not report it again.
        """
        return self.engine.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix (vLLM's name), e.g. so that timings of runs over the
        same prompts start alike. Returns True when reset, False (nothing changed) while requests
        hold KV blocks."""
        return self.engine.reset_prefix_cache()

    def metrics(self) -> dict:
        """num_waiting, num_running, kv_blocks_{total,free,used}, prefix_cache_{hit_tokens,queries}."""
        return self.engine.metrics()

    def warm_up(self) -> float:
        """Compile the forward's graphs now rather than in the first requests, as a server does
        before it opens its port. Two three-token `ar` answers, of one prompt and of two, run
        every kind of step: a prefill and one-token decodes, at batch 1 and above, the four
        graphs of a compiled CPU engine (`buckets.StepShape.of`), whose dynamic sizes then serve
        every decoder, window and prompt length. A CUDA engine still captures a CUDA graph on the
        first step of each further bucket. The prompts' KV blocks are freed and the prefix cache
        is emptied. Must run with no request in flight.

        Returns:
            the seconds it took (0.0 for an eager engine, which has nothing to compile).

        Raises:
            RuntimeError: requests are unfinished.
        """
        if self.engine.enforce_eager:
            return 0.0
        if self.has_unfinished():
            raise RuntimeError("warm_up() needs an idle engine: requests are unfinished")
        start = time.perf_counter()
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, decoding="ar")
        # token ids, not text (a model may come without a tokenizer); prompts of 3 and 9 tokens, as a
        # size of 1 would compile a graph specialised to it
        ids = [i for i in range(4, 16) if i != self.engine.mask_token_id]
        for prompts in ([ids[:3]], [ids[:3], ids[:9]]):
            self.generate(prompts, params)
        self.reset_prefix_cache()
        seconds = time.perf_counter() - start
        log.info("warm-up: the compiled forward's graphs are ready (%.1f s)", seconds)
        return seconds

    # ---- batch API ----------------------------------------------------------------

    def generate(self, prompts: str | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[dict]:
        """Generate for every prompt; results in input order.

        Returns:
            one dict per prompt: {"text", "token_ids", "finish_reason", "stats"}
            ("error" too when a request failed; "logprobs", a `TokenLogprob` per token id,
            with `SamplingParams.logprobs`; "prompt_logprobs" with `prompt_logprobs`).
        """
        prompts, params = self._normalise(prompts, sampling_params)
        ids = self._add_all(prompts, params, stream=False)
        index = {rid: i for i, rid in enumerate(ids)}
        results = [{"text": "", "token_ids": [], "finish_reason": None, "stats": None} for _ in ids]
        bar = _progress(len(ids)) if use_tqdm else None
        while any(r["finish_reason"] is None for r in results):
            for delta in self.engine.step():
                i = index.get(delta.request_id)
                if i is None:
                    continue
                res = results[i]
                res["token_ids"].extend(delta.new_token_ids)
                res["text"] += delta.new_text
                if delta.logprobs is not None:
                    res.setdefault("logprobs", []).extend(delta.logprobs)
                if delta.prompt_logprobs is not None:
                    res["prompt_logprobs"] = delta.prompt_logprobs
                if delta.finished:
                    res["finish_reason"], res["stats"] = delta.finish_reason, delta.stats
                    if delta.error:
                        res["error"] = delta.error
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return results

    def generate_stream(self, prompts: str | list[str] | list[list[int]],
                        sampling_params: SamplingParams | list[SamplingParams] | None = None
                        ) -> Iterator[dict]:
        """Yield increments as tokens are committed.

        Each item: {"index", "request_id", "new_token_ids", "new_text", "finished",
        "finish_reason", "step_index", "stats", "logprobs", "prompt_logprobs"} (the last two
        as in `StreamDelta`). Closing the generator aborts
        the unfinished requests.
        """
        prompts, params = self._normalise(prompts, sampling_params)
        ids = self._add_all(prompts, params, stream=True)
        index = {rid: i for i, rid in enumerate(ids)}
        open_ids = set(ids)
        try:
            while open_ids:
                for d in self.engine.step():
                    if d.request_id not in index:
                        continue
                    if d.finished:
                        open_ids.discard(d.request_id)
                    yield {"index": index[d.request_id], "request_id": d.request_id,
                           "new_token_ids": d.new_token_ids, "new_text": d.new_text,
                           "finished": d.finished, "finish_reason": d.finish_reason,
                           "step_index": d.step_index, "stats": d.stats, "logprobs": d.logprobs,
                           "prompt_logprobs": d.prompt_logprobs}
        finally:
            for rid in open_ids:
                self.engine.abort(rid)

    def _add_all(self, prompts: list, params: list[SamplingParams], stream: bool) -> list[str]:
        """Queue all requests, or none: a bad one aborts those already added and re-raises."""
        ids: list[str] = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.engine.add_request(prompt, p, stream=stream))
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return ids

    @staticmethod
    def _normalise(prompts, sampling_params) -> tuple[list, list[SamplingParams]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        else:
            prompts = list(prompts)
            if prompts and isinstance(prompts[0], numbers.Integral):
                prompts = [prompts]  # one prompt of token ids (list, tuple or numpy array)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            if isinstance(sampling_params, (str, bytes, Mapping)) or not isinstance(sampling_params, Iterable):
                # a dict would be read as a list of its keys, and then miscounted
                raise RequestError("sampling_params", "sampling_params must be a SamplingParams or a list of them, "
                                                      f"got {type(sampling_params).__name__}")
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise RequestError("sampling_params", f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        return prompts, params


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="req")
