"""The tiny model's curriculum as an evaluation suite: generate with a decoder, score per task and op.

Used by `recipes/tune_decoding.py` (validation split) and `recipes/eval_wedlm_tiny.py` (test
split). Items come from `wedlm.data.curriculum.examples(task, n, split)`; splits are disjoint
from training by construction. Scores: the whole answer exactly (count; whitespace at the ends
ignored), the same list (listops: `wedlm.evaluate.listops.same_list`, the rule of `wedlm eval` and
`wedlm bench`), the final number (addsub). "stopped" is the share of answers that ended with
an end token rather than at max_tokens.
"""

from __future__ import annotations

import time

from wedlm.data import curriculum
from wedlm.evaluate.curriculum import score_example as score  # the one scorer: wedlm eval, bench, recipes

MAX_TOKENS = {"count": 1024, "addsub": 32, "listops": 48}


def items(split: str, n: dict[str, int]) -> list[dict]:
    """Curriculum examples of `split`, `n[task]` per task, in task order."""
    return [ex for task, k in n.items() for ex in curriculum.examples(task, k, split)]


def chat_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt as one user turn with the generation prompt (the engine's encoding)."""
    from wedlm.engine.chat import encode_chat

    return [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in prompts]


def run(llm, exs: list[dict], decoding: str, tau: float, lam: float, stop_by_ar: bool | None = None,
        stop_in_run: bool | None = None, max_tokens: int | None = None) -> list[dict]:
    """Greedy generation of every item with `decoding`; one record per item. `stop_by_ar`,
    `stop_in_run`: `SamplingParams.wedlm_stop_by_ar` / `wedlm_stop_in_run` (None = the model's
    generation_config.json default); `max_tokens` replaces the per-task cap `MAX_TOKENS`.

    Records: task, op, right, stopped, text, decode_tokens, decode_forwards, fed_tokens.
    """
    from wedlm import SamplingParams

    ids = chat_ids(llm.tokenizer, [ex["prompt"] for ex in exs])
    extra = {k: v for k, v in (("wedlm_stop_by_ar", stop_by_ar), ("wedlm_stop_in_run", stop_in_run)) if v is not None}
    params = [SamplingParams(max_tokens=max_tokens or MAX_TOKENS[ex["task"]], temperature=0, decoding=decoding,
                             wedlm_entropy_threshold=tau, wedlm_pos_penalty_factor=lam, **extra) for ex in exs]
    t0 = time.time()
    outs = llm.generate(ids, params)
    wall = time.time() - t0
    recs = []
    for ex, o in zip(exs, outs):
        s = o["stats"] or {}
        recs.append({"task": ex["task"], "op": ex["op"], "right": score(ex, o["text"]),
                     "stopped": o["finish_reason"] == "stop", "text": o["text"],
                     "decode_tokens": s.get("decode_tokens", 0), "decode_forwards": s.get("decode_forwards", 0),
                     "fed_tokens": s.get("fed_tokens", 0), "wall_s": wall})
    return recs


def table(recs: list[dict], by: str = "task") -> dict[str, dict]:
    """Per group (`by` = "task" or "task/op"): n, accuracy, stopped, tokens_per_forward, p_cache."""
    groups: dict[str, list[dict]] = {}
    for r in recs:
        key = r["task"] if by == "task" else f"{r['task']}/{r['op']}"
        groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        toks = sum(r["decode_tokens"] for r in rs)
        fwd = sum(r["decode_forwards"] for r in rs)
        fed = sum(r["fed_tokens"] for r in rs)
        out[key] = {"n": len(rs), "accuracy": sum(r["right"] for r in rs) / len(rs),
                    "stopped": sum(r["stopped"] for r in rs) / len(rs),
                    "tokens_per_forward": toks / fwd if fwd else 0.0, "p_cache": toks / fed if fed else 1.0}
    return out
