"""A deterministic stand-in for `wedlm.LLM` with the same step/delta contract.

It "generates" the prompt's token ids in reverse order, committing `per_step` tokens per
step, holds one KV block per `block_size` tokens while running, and can sleep per step,
so engine-loop tests (batching, abort, disconnects, failures) run without a model and
with exactly known outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from wedlm.engine.errors import RequestError
from wedlm.engine.outputs import StreamDelta


@dataclass
class FakeParams:
    """The SamplingParams fields the fake reads."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    decoding: str = "wedlm"
    extra: dict = field(default_factory=dict)

    def __init__(self, max_tokens: int = 16, temperature: float = 0.0, top_p: float = 1.0,
                 decoding: str = "wedlm", **extra):
        if temperature < 0:
            raise RequestError("temperature", f"temperature must be >= 0, got {temperature}")
        self.max_tokens, self.temperature, self.top_p, self.decoding = max_tokens, temperature, top_p, decoding
        self.extra = extra


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    target: list[int]
    step: int = 0
    done: int = 0


class FakeLLM:
    """`wedlm.LLM`'s serving contract over a reversing 'model'."""

    def __init__(self, tokenizer, max_model_len: int = 256, per_step: int = 3, step_sleep: float = 0.0,
                 block_size: int = 16, blocks: int = 64, fail_on_step: int | None = None,
                 fail_on_done: int | None = None):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.model_path = "fake-model"
        self.per_step, self.step_sleep, self.block_size = per_step, step_sleep, block_size
        self.blocks_total = blocks
        self.fail_on_step = fail_on_step
        self.fail_on_done = fail_on_done  # raise once a running request has this many tokens
        self.steps = 0
        self.running: dict[str, _Req] = {}
        self.threads: set[int] = set()

    def _touch(self) -> None:
        import threading
        self.threads.add(threading.get_ident())

    def expected(self, prompt: list[int], max_tokens: int) -> list[int]:
        """What the fake generates for `prompt`."""
        return list(reversed(prompt))[:max_tokens]

    def add_request(self, prompt, params, request_id=None) -> str:
        self._touch()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if len(ids) > self.max_model_len - 1:
            raise RequestError("prompt", f"prompt is {len(ids)} tokens, over max_model_len {self.max_model_len}")
        rid = request_id or f"fake-{len(self.running)}"
        self.running[rid] = _Req(rid, ids, self.expected(ids, params.max_tokens))
        return rid

    def step(self) -> list[StreamDelta]:
        self._touch()
        self.steps += 1
        if self.fail_on_step is not None and self.steps == self.fail_on_step:
            raise RuntimeError("boom")
        if self.fail_on_done is not None and any(r.done >= self.fail_on_done for r in self.running.values()):
            raise RuntimeError("boom")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        out = []
        for req in list(self.running.values()):
            new = req.target[req.done:req.done + self.per_step]
            req.done += len(new)
            req.step += 1
            finished = req.done >= len(req.target)
            if finished:
                del self.running[req.rid]
            out.append(StreamDelta(req.rid, new, self.tokenizer.decode(new), finished,
                                   "length" if finished else None, req.step - 1,
                                   self.stats(req) if finished else None))
        return out

    @staticmethod
    def stats(req: _Req) -> dict:
        """What the fake reports for a request: `step` forwards, two fed tokens per generated one."""
        return {"prompt_tokens": len(req.prompt), "decode_tokens": req.done, "decode_forwards": req.step,
                "fed_tokens": req.done * 2, "tokens_per_forward": req.done / req.step if req.step else 0.0,
                "p_cache": 0.5, "prefix_cache_hit_tokens": 0, "ttft_s": 0.001}

    def abort(self, request_id: str) -> StreamDelta | None:
        """The request's final "abort" delta with its stats so far (None when unknown), as `LLM.abort`."""
        self._touch()
        req = self.running.pop(request_id, None)
        if req is None:
            return None
        return StreamDelta(req.rid, [], "", True, "abort", req.step, self.stats(req))

    def has_unfinished(self) -> bool:
        return bool(self.running)

    def metrics(self) -> dict:
        used = sum(-(-(len(r.prompt) + r.done) // self.block_size) for r in self.running.values())
        return {"num_waiting": 0, "num_running": len(self.running), "kv_blocks_total": self.blocks_total,
                "kv_blocks_free": self.blocks_total - used, "kv_blocks_used": used,
                "prefix_cache_hit_tokens": 0, "prefix_cache_queries": 0}
