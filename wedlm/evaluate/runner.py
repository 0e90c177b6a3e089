"""Run evaluation tasks through the engine: accuracy with tokens/forward, p_cache and tok/s.

What: `DecodeConfig` (decoder and its knobs), `render_prompts` (chat template or
raw text, tokenised once), `evaluate_task` (generate in batches, score, aggregate)
and `evaluate` (several tasks, one report dict).

Why: quality and speed must come from the same generations so a setting's
accuracy is read next to what it cost; the engine's per-request stats are
summed with `metrics.aggregate` (Eq. 4).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from tqdm import tqdm

from ..engine.chat import encode_chat
from ..engine.defaults import DECODERS, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY, check_knob
from .metrics import aggregate
from .tasks import EvalItem, EvalTask

PROMPT_STYLES = ("auto", "chat", "raw")
# Tokens of each warm-up generation: enough for prefill and several decode steps of every decoder.
WARM_UP_TOKENS = 4


@dataclass(slots=True)
class DecodeConfig:
    """How to decode: `decoding` strategy, WeDLM threshold tau and distance penalty lambda.

    `window_size` None keeps the engine's default; `temperature` 0 is greedy; tau None fills
    one mask per step. `wedlm eval` passes the model's generation_config.json values
    (`wedlm.engine.defaults.model_decoding_defaults`).
    """

    decoding: str = "wedlm"
    tau: float | None = DEFAULT_ENTROPY_THRESHOLD
    lam: float = DEFAULT_POS_PENALTY
    window_size: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0

    def __post_init__(self) -> None:
        if self.decoding not in DECODERS:
            raise ValueError(f"decoding must be one of {DECODERS}, got {self.decoding!r}")
        check_knob("wedlm_entropy_threshold", self.tau)
        check_knob("wedlm_pos_penalty_factor", self.lam)

    def sampling_params(self, max_tokens: int, stop: list[str] | None = None):
        """The engine's `SamplingParams` for one task."""
        from wedlm import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens,
                              stop=list(stop or []), wedlm_entropy_threshold=self.tau,
                              wedlm_pos_penalty_factor=self.lam, seed=self.seed,
                              decoding=self.decoding, wedlm_window_size=self.window_size)


def use_chat(tokenizer, style: str) -> bool:
    """Whether prompts go through the chat template ("auto": when the tokenizer has one)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    if style == "auto":
        return bool(getattr(tokenizer, "chat_template", None))
    return style == "chat"


def render_prompts(tokenizer, items: list[EvalItem], chat: bool) -> list[list[int]]:
    """Token ids of each item's prompt: chat template with generation prompt (message text never
    becomes control tokens, `wedlm.engine.chat.encode_chat`), or the raw text as given."""
    if chat:
        return [encode_chat(tokenizer, item.messages) for item in items]
    return [list(tokenizer(item.raw, add_special_tokens=False)["input_ids"]) for item in items]


def cut_at_stops(text: str, stops: list[str]) -> str:
    """`text` up to the earliest stop string (engines already stop there; this makes it certain)."""
    cut = len(text)
    for stop in stops:
        at = text.find(stop)
        if at >= 0:
            cut = min(cut, at)
    return text[:cut]


def evaluate_task(llm, task: EvalTask, decode: DecodeConfig, prompt_style: str = "auto",
                  batch_size: int = 8, samples: int = 3, progress: bool = True) -> dict:
    """Generate every item of `task`, score it, and aggregate speed.

    Returns:
        {task, kind, n, correct, accuracy (None for speed-only tasks), decode settings,
         metrics (see `metrics.aggregate`), samples (first `samples` items: prompt,
         output, predicted, correct)}.
    """
    chat = use_chat(llm.tokenizer, prompt_style)
    stops = task.stop + ([] if chat else task.raw_stop)
    params = decode.sampling_params(task.max_tokens, stops)
    prompts = render_prompts(llm.tokenizer, task.items, chat)
    stats, records, wall = [], [], 0.0
    bar = tqdm(total=len(prompts), desc=f"eval {task.name}", unit="item", disable=not progress)
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        t0 = time.perf_counter()
        outputs = llm.generate(batch, [params] * len(batch))
        wall += time.perf_counter() - t0
        for item, out in zip(task.items[start:start + batch_size], outputs):
            text = cut_at_stops(out["text"], stops)
            score = task.score(item, text) if task.score else None
            stats.append(out["stats"])
            records.append({"id": item.id, "output": text, "finish_reason": out.get("finish_reason"),
                            "predicted": score.predicted if score else None,
                            "correct": score.correct if score else None})
        bar.update(len(batch))
    bar.close()
    correct = sum(bool(r["correct"]) for r in records)
    return {"task": task.name, "kind": task.kind, "n": len(records),
            "correct": correct if task.score else None,
            "accuracy": correct / len(records) if task.score else None,
            "prompt_style": "chat" if chat else "raw", "decode": asdict(decode),
            "metrics": aggregate(stats, wall), "samples": records[:samples]}


def warm_up(llm, tasks: list[EvalTask], decode: DecodeConfig, prompt_style: str = "auto",
            batch_size: int = 8) -> None:
    """Untimed short generations with `decode` at batch 1 and at `batch_size`, so the timed
    ones do not pay one-off costs: the compiled forward builds a graph the first time it sees
    a batch of one or more sequences and one query per sequence or more (about 4 s on a CPU),
    and an uncounted compile would land in the first decoder's tok/s and TTFT only."""
    if not tasks or not tasks[0].items:
        return
    chat = use_chat(llm.tokenizer, prompt_style)
    prompt = render_prompts(llm.tokenizer, tasks[0].items[:1], chat)[0]
    params = decode.sampling_params(WARM_UP_TOKENS)
    for b in sorted({1, batch_size}):
        llm.generate([prompt] * b, [params] * b)


def evaluate(llm, tasks: list[EvalTask], decode: DecodeConfig, prompt_style: str = "auto",
             batch_size: int = 8, progress: bool = True, samples: int = 3) -> list[dict]:
    """`warm_up`, then `evaluate_task` for each task, in order (`samples`: items kept per report).
    The engine's prefix cache is emptied after the warm-up, so each decoder's timed run starts
    from the same cold cache, whichever decoder ran before."""
    warm_up(llm, tasks, decode, prompt_style, batch_size)
    llm.reset_prefix_cache()
    return [evaluate_task(llm, t, decode, prompt_style, batch_size, samples, progress) for t in tasks]
