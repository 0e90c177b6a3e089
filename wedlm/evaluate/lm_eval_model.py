"""The `wedlm` model of EleutherAI's lm-evaluation-harness (`pip install -e .[eval]`).

What: `WeDLMLM`, registered with the harness as `wedlm` when this module is
imported, so every harness task runs on our engine with any decoder:

* `generate_until`: all requests of a call go to the engine at once (it
  batches them continuously), each with its own `until` strings,
  `max_gen_toks`, `do_sample` / `temperature` / `top_p` / `top_k`;
* `loglikelihood` / `loglikelihood_rolling`: teacher forcing through the AR
  head (`wedlm.evaluate.loglikelihood`), so multiple-choice and perplexity
  tasks run too. For a WeDLM checkpoint this is the AR head's likelihood, not
  a likelihood of parallel decoding;
* decode statistics (tokens per forward, p_cache, forwards, tokens/s, Eq. 4
  sums over requests) go into the harness's results under
  `config.wedlm_decode_stats` and are printed when the run ends.

Model arguments (`--model_args key=value,...`): `pretrained` (model folder),
`decoding` (wedlm | ar | blockwise | verified), `wedlm_entropy_threshold`,
`wedlm_pos_penalty_factor`, `wedlm_window_size` (None = the model folder's
generation_config.json, else the engine's defaults), `dtype`, `max_model_len`,
`max_num_seqs`, `max_gen_toks` (default budget when a task sets none),
`max_batch_tokens` (loglikelihood rows x length per forward), `seed`, and the
engine's `autocast` and `enforce_eager` (each None = automatic, True, False).

Why a module import instead of a plugin: lm-eval 0.4 finds models only in
modules it has imported, so `wedlm lm-eval ...` imports this module and then
runs the harness's own command line.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from wedlm.engine.sampling_params import SamplingParams

from .loglikelihood import ScoreRequest, rolling_requests, score_requests, sum_rolling
from .metrics import aggregate
from .runner import cut_at_stops

logger = logging.getLogger(__name__)

MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
KNOWN_GEN_KEYS = frozenset({"until", "do_sample", "temperature", "top_p", "top_k", "seed", *MAX_TOKEN_KEYS})


def resolve_device(device: str | None) -> str | None:
    """The engine's device: None stays None (cuda when available); a CUDA device on a machine
    without CUDA becomes "cpu" (the harness passes "cuda:0" unless told otherwise)."""
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("device %r requested but CUDA is not available; running on cpu", device)
        return "cpu"
    return device


def sampling_params(gen_kwargs: dict, default_max_tokens: int, decode: dict) -> SamplingParams:
    """The engine's `SamplingParams` for one `generate_until` request.

    Args:
        gen_kwargs: the task's generation kwargs (`until`, `max_gen_toks` or an alias,
            `do_sample`, `temperature`, `top_p`, `top_k`, `seed`); other keys are ignored
            with a warning.
        default_max_tokens: budget when no max-token key is given.
        decode: fixed decoder settings (`decoding`, WeDLM knobs) merged in.

    Raises:
        ValueError: `until` not a string or list of strings; a bad value (from `SamplingParams`).
    """
    kwargs = dict(gen_kwargs or {})
    unknown = sorted(set(kwargs) - KNOWN_GEN_KEYS)
    if unknown:
        logger.warning("generation kwargs %s are not supported by the wedlm model and are ignored", unknown)
    until = kwargs.get("until") or []
    if isinstance(until, str):
        until = [until]
    if not isinstance(until, (list, tuple)) or not all(isinstance(s, str) for s in until):
        raise ValueError(f"until must be a string or a list of strings, got {until!r}")
    max_tokens = next((kwargs[k] for k in MAX_TOKEN_KEYS if kwargs.get(k) is not None), default_max_tokens)
    do_sample = kwargs.get("do_sample")
    temperature = float(kwargs.get("temperature", 0.0) or 0.0)
    if do_sample is False:
        temperature = 0.0
    fields = {**decode, **{k: kwargs[k] for k in ("top_p", "top_k", "seed") if kwargs.get(k) is not None}}
    return SamplingParams(temperature=temperature, max_tokens=int(max_tokens), stop=[s for s in until if s],
                          **fields)


@register_model("wedlm")
class WeDLMLM(TemplateLM):
    """lm-evaluation-harness model backed by `wedlm.LLM`.

    `llm` reuses an already loaded `wedlm.LLM` (then `pretrained` only names it in reports).

    Raises (at construction):
        ValueError: an unknown `decoding` or a bad engine setting, naming it.
    """

    def __init__(self, pretrained: str, decoding: str = "wedlm", wedlm_entropy_threshold: float | None = None,
                 wedlm_pos_penalty_factor: float | None = None, wedlm_window_size: int | None = None,
                 device: str | None = None, dtype: str | None = None, max_model_len: int | None = None,
                 max_num_seqs: int = 64, max_gen_toks: int = 256, max_batch_tokens: int = 4096, seed: int = 0,
                 autocast: bool | None = None, enforce_eager: bool | None = None, batch_size: Any = None,
                 max_batch_size: Any = None, llm=None) -> None:
        super().__init__()
        from wedlm import LLM

        self.decode = {"decoding": decoding, "seed": int(seed)}
        if wedlm_entropy_threshold is not None:
            self.decode["wedlm_entropy_threshold"] = float(wedlm_entropy_threshold)
        if wedlm_pos_penalty_factor is not None:
            self.decode["wedlm_pos_penalty_factor"] = float(wedlm_pos_penalty_factor)
        if wedlm_window_size is not None:
            self.decode["wedlm_window_size"] = int(wedlm_window_size)
        SamplingParams(**self.decode)  # a bad decoder or knob fails here, named, before the model loads
        self.llm = llm or LLM(model=pretrained, wedlm_window_size=wedlm_window_size, max_model_len=max_model_len,
                              max_num_seqs=int(max_num_seqs), device=resolve_device(device), dtype=dtype,
                              seed=int(seed), autocast=autocast, enforce_eager=enforce_eager)
        self.tokenizer = self.llm.tokenizer
        if self.tokenizer is None:
            raise ValueError(f"{pretrained}: the wedlm model needs a tokenizer in the model folder")
        self.pretrained = str(pretrained)
        self.max_gen_toks = int(max_gen_toks)
        self.max_batch_tokens = int(max_batch_tokens)
        self.gen_stats: list[dict] = []
        self.gen_wall_s = 0.0
        self.score_counts = {"requests": 0, "tokens": 0, "wall_s": 0.0}
        self._chat_ids: dict[str, tuple[int, ...]] = {}  # rendered chat text -> encode_chat ids

    # ---- tokenisation (TemplateLM contract) ---------------------------------------

    @property
    def eot_token_id(self) -> int:
        """End-of-text id: the tokenizer's EOS, the conditioning token of empty contexts."""
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        """Most tokens one sequence may hold (the engine's max_model_len)."""
        return self.llm.max_model_len

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of `string` (no special tokens unless asked).

        A string this object rendered in `apply_chat_template` gets the ids of
        `wedlm.engine.chat.encode_chat` instead: the template's own control tokens are
        special ids, and special-token text inside a message stays plain text (the harness
        hands prompts over as text, so encoding the text again would let a message forge
        turns). For ordinary messages the two encodings are the same ids.
        """
        chat = self._chat_ids.get(string)
        if chat is not None and not add_special_tokens:
            return list(chat)
        return list(self.tokenizer(string, add_special_tokens=bool(add_special_tokens))["input_ids"])

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The tokenizer's chat template as text (`--apply_chat_template`); remembers the
        safe token ids of that text for `tok_encode` (with a generation prompt)."""
        text = self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)
        if add_generation_prompt:
            from wedlm.engine.chat import encode_chat

            self._chat_ids[text] = tuple(encode_chat(self.tokenizer, chat_history, add_generation_prompt=True))
        return text

    # ---- scoring ------------------------------------------------------------------

    def _score(self, requests: list[ScoreRequest], progress: bool) -> list:
        engine = self.llm.engine
        if getattr(engine.config, "tensor_parallel_size", 1) > 1:
            raise NotImplementedError("loglikelihood needs the whole model in this process; "
                                      "run it with tensor_parallel_size=1")
        t0 = time.perf_counter()
        results = score_requests(engine.model, requests, self.max_length, self.max_batch_tokens,
                                 engine.mask_token_id, progress, getattr(engine.runner, "autocast", None))
        self.score_counts["requests"] += len(requests)
        self.score_counts["tokens"] += sum(len(r.continuation) for r in requests)
        self.score_counts["wall_s"] += time.perf_counter() - t0
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log P(continuation | context), is_greedy) for TemplateLM's tokenised requests."""
        pairs = [ScoreRequest(tuple(ctx), tuple(cont)) for _, ctx, cont in requests]
        out = []
        for (key, _, _), res in zip(requests, self._score(pairs, not disable_tqdm)):
            answer = (res.logprob, res.is_greedy)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log P(document | EOS) of each request's whole string, in windows of max_model_len tokens."""
        windows, owners = [], []
        for i, req in enumerate(requests):
            pieces = rolling_requests(self.tok_encode(req.args[0]), self.prefix_token_id, self.max_length)
            windows += pieces
            owners += [i] * len(pieces)
        per_request: list[list] = [[] for _ in requests]
        for owner, result in zip(owners, self._score(windows, not disable_tqdm)):
            per_request[owner].append(result)
        out = []
        for req, results in zip(requests, per_request):
            total = sum_rolling(results)
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
            out.append(total)
        return out

    # ---- generation ---------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continuations of every request, generated in one engine run, cut at `until`.

        Contexts longer than max_model_len - max_gen_toks are cut from the left.

        Raises:
            ValueError: `max_gen_toks` >= max_model_len, or a bad generation setting.
        """
        prompts, params = [], []
        for req in requests:
            context, gen_kwargs = req.args
            p = sampling_params(gen_kwargs, self.max_gen_toks, self.decode)
            room = self.max_length - p.max_tokens
            if room < 1:
                raise ValueError(f"max_gen_toks={p.max_tokens} leaves no room for a prompt within "
                                 f"max_model_len={self.max_length}")
            prompts.append(self.tok_encode(context)[-room:])
            params.append(p)
        t0 = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=not disable_tqdm) if prompts else []
        self.gen_wall_s += time.perf_counter() - t0
        texts = []
        for req, p, out in zip(requests, params, outputs):
            if out.get("error"):
                raise RuntimeError(f"request failed in the engine: {out['error']}")
            text = cut_at_stops(out["text"], p.stop_strings)
            self.gen_stats.append(out["stats"])
            self.cache_hook.add_partial("generate_until", req.args, text)
            texts.append(text)
        return texts

    # ---- report -------------------------------------------------------------------

    def decode_stats(self) -> dict:
        """Decode statistics of this model's run so far.

        Returns:
            {decoding, generation: `metrics.aggregate` of every generated request (tokens per
            forward, p_cache, decode forwards, tokens/s, TTFT), loglikelihood: {requests,
            tokens, wall_s} of the teacher-forced scoring}.
        """
        return {"decoding": self.decode["decoding"],
                "generation": aggregate(self.gen_stats, self.gen_wall_s) if self.gen_stats else None,
                "loglikelihood": dict(self.score_counts)}

    def get_model_info(self) -> dict:
        """Added by the harness to its results' `config` (called once, after the evaluation)."""
        stats = self.decode_stats()
        print(format_decode_stats(stats))
        return {"wedlm_decode_stats": stats, "wedlm_decode_settings": dict(self.decode)}


def format_decode_stats(stats: dict) -> str:
    """One summary line per part of `WeDLMLM.decode_stats()` for the console."""
    lines = [f"wedlm decode stats ({stats['decoding']}):"]
    gen = stats.get("generation")
    if gen:
        lines.append(f"  generate_until: {gen['requests']} requests, {gen['decode_tokens']} tokens in "
                     f"{gen['decode_forwards']} forwards = {gen['tokens_per_forward']:.2f} tokens/forward, "
                     f"p_cache {gen['p_cache']:.2f}, {gen['tokens_per_s']:.1f} tokens/s")
    ll = stats.get("loglikelihood") or {}
    if ll.get("requests"):
        lines.append(f"  loglikelihood: {ll['requests']} requests, {ll['tokens']} scored tokens "
                     f"in {ll['wall_s']:.2f} s")
    if len(lines) == 1:
        lines.append("  no requests")
    return "\n".join(lines)
