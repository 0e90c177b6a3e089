"""The systems a benchmark compares, behind one `generate(prompts, max_tokens)` interface.

What:
- `EngineSystem`: one decoder of our engine (`wedlm` streaming at a given tau and
  lambda, `blockwise`, `verified`, `ar`) on a shared `LLM`, greedy.
- `TransformersSystem`: transformers' `generate(do_sample=False)` on the same
  safetensors, the external AR peer. A `model_type: "wedlm"` checkpoint is
  loaded as Qwen3ForCausalLM (q/k norm, no bias) or Qwen2ForCausalLM (bias, no
  q/k norm) from a config built out of our `ModelConfig`.
Both return, per prompt, `{"token_ids", "text", "finish_reason", "stats"}` with the
engine's stats keys, so the runner treats them alike.

Why: speed-ups are only meaningful between systems run on the same weights,
prompts and stop rules in the same process and machine state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..engine.defaults import DECODERS


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """Which system: `kind` "engine" (with `decoding`, `tau`, `lam`) or "transformers"."""

    kind: str
    decoding: str = "ar"
    tau: float | None = None
    lam: float | None = None

    @property
    def name(self) -> str:
        """Display name, e.g. "wedlm t=0.4 l=0.02", "blockwise t=0.9", "ar", "transformers"."""
        if self.kind == "transformers":
            return "transformers"
        if self.decoding in ("wedlm", "blockwise"):
            name = f"{self.decoding} t={self.tau:g}"
            return name + (f" l={self.lam:g}" if self.decoding == "wedlm" else "")
        return self.decoding


def finish_reason(token_ids: list[int], stop_ids: set[int]) -> str:
    """"stop" when the last token is a stop id, else "length"."""
    return "stop" if token_ids and token_ids[-1] in stop_ids else "length"


class EngineSystem:
    """One engine decoder on a shared `wedlm.LLM` (greedy, fixed tau/lambda)."""

    def __init__(self, llm, spec: SystemSpec, window_size: int | None = None) -> None:
        if spec.kind != "engine" or spec.decoding not in DECODERS:
            raise ValueError(f"not an engine decoder: {spec}")
        self.llm, self.spec, self.window_size = llm, spec, window_size
        self.name = spec.name

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[dict]:
        """Greedy generation of each prompt (token ids); engine output dicts."""
        from wedlm import SamplingParams

        extra = {}
        if self.spec.tau is not None:
            extra["wedlm_entropy_threshold"] = self.spec.tau
        if self.spec.lam is not None:
            extra["wedlm_pos_penalty_factor"] = self.spec.lam
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, decoding=self.spec.decoding,
                                wedlm_window_size=self.window_size, seed=0, **extra)
        return self.llm.generate(prompts, [params] * len(prompts))


def hf_config(path: str | Path):
    """A transformers Qwen2Config / Qwen3Config for the checkpoint at `path` (any supported model_type).

    Raises:
        NotImplementedError: a WeDLM checkpoint mixing styles (bias with q/k norm
            is Qwen3 with `attention_bias`; no bias and no q/k norm has no HF class).
    """
    from transformers import Qwen2Config, Qwen3Config

    from wedlm.model.config import ModelConfig

    cfg = ModelConfig.from_file(path)
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                  intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
                  num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                  rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
                  tie_word_embeddings=cfg.tie_word_embeddings, rope_theta=cfg.rope.theta)
    if cfg.rope.rope_type != "default":
        common["rope_scaling"] = {"rope_type": cfg.rope.rope_type, "factor": cfg.rope.factor,
                                  "original_max_position_embeddings": cfg.rope.original_max_position_embeddings}
    if cfg.qk_norm:
        return Qwen3Config(head_dim=cfg.head_dim, attention_bias=cfg.attention_bias, **common)
    if cfg.attention_bias and cfg.head_dim * cfg.num_attention_heads == cfg.hidden_size:
        return Qwen2Config(**common)
    raise NotImplementedError(f"{path}: no transformers class for attention_bias={cfg.attention_bias}, "
                              f"qk_norm={cfg.qk_norm}, head_dim={cfg.head_dim}")


def load_hf_model(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """transformers' Qwen2/Qwen3ForCausalLM with the checkpoint's weights, in eval mode."""
    from transformers import Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    from wedlm.model.loader import resolve_dtype

    hf_logging.set_verbosity_error()  # the "model of type wedlm" notice and load bars are expected here
    hf_logging.disable_progress_bar()
    config = hf_config(path)
    cls = Qwen3ForCausalLM if isinstance(config, Qwen3Config) else Qwen2ForCausalLM
    model = cls.from_pretrained(str(path), config=config, dtype=resolve_dtype(dtype))
    return model.to(device).eval()


class _FirstTokenClock:
    """A generate() streamer that records when the first new token appears (TTFT)."""

    def __init__(self) -> None:
        self.calls, self.first_token_at = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:  # call 1 is the prompt
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


class TransformersSystem:
    """transformers `generate` (greedy, KV cache) on the same weights: the external AR peer."""

    name = "transformers"

    def __init__(self, path: str | Path, tokenizer, stop_ids: list[int], dtype: str = "float32",
                 device: str = "cpu") -> None:
        self.model = load_hf_model(path, dtype, device)
        self.tokenizer, self.stop_ids, self.device = tokenizer, list(stop_ids), device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.spec = SystemSpec(kind="transformers")

    def _batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and attention mask, (batch, max_prompt_len) each."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[dict]:
        """Greedy generation of a batch; every row's tokens are cut after its first stop id."""
        ids, mask = self._batch(prompts)
        clock = _FirstTokenClock()
        t0 = time.perf_counter()
        out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                  max_new_tokens=max_tokens, eos_token_id=self.stop_ids,
                                  pad_token_id=self.pad_id, streamer=clock, top_k=None,
                                  top_p=None, temperature=None)
        if str(self.device).startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        ttft = (clock.first_token_at - t0) if clock.first_token_at else elapsed
        stop = set(self.stop_ids)
        results = []
        for row, p in enumerate(prompts):
            new = out[row, ids.shape[1]:].tolist()
            cut = next((i + 1 for i, t in enumerate(new) if t in stop), len(new))
            new = new[:cut]
            n = len(new)
            stats = {"prompt_tokens": len(p), "decode_tokens": n, "decode_forwards": n, "fed_tokens": n,
                     "tokens_per_forward": 1.0 if n else 0.0, "p_cache": 1.0,
                     "prefix_cache_hit_tokens": 0, "ttft_s": ttft,
                     "decode_tokens_per_s": (n - 1) / (elapsed - ttft) if n > 1 and elapsed > ttft else 0.0,
                     "commits": [1] * n}
            text = self.tokenizer.decode([t for t in new if t not in stop], skip_special_tokens=True)
            results.append({"token_ids": new, "text": text, "finish_reason": finish_reason(new, stop),
                            "stats": stats})
        return results
