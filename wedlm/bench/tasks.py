"""The benchmark's task suite, one per entropy regime the paper measures (§6.6).

What: `bench_tasks(names, quick)` builds `EvalTask`s:
- counting (low entropy): "Count from 1 to 200." (the paper's headline demo) then
  held-out counting prompts (the curriculum's test split: ranges in 0..1100, up or
  down, steps 1/2/5/10);
- arithmetic (structured reasoning): held-out two-digit "What is A + B?" /
  "What is A - B?" (curriculum test split);
- listops (list operations, ParallelBench's family): copy / reverse / sort /
  insert / remove / replace on short name lists (curriculum test split);
- code (code completion): held-out stdlib chunks cut mid-file, "Complete this
  Python code:" as in the tiny model's SFT; speed only;
- text (open-ended): free-form prose prompts; speed only.

The three curriculum tasks are scored by `wedlm.evaluate.curriculum` (the rules of
`wedlm eval` and the model card).

Why: WeDLM's gain shrinks as entropy grows (1673 / 745 / 198 tok/s for
counting / math / open-ended on a GPU); a suite that spans the regimes shows
where the speed comes from. `--quick` keeps the shortest counting prompts and
few tokens so a run takes about a minute.
"""

from __future__ import annotations

import random

from wedlm.evaluate.curriculum import example_item, heldout_examples, score_item
from wedlm.evaluate.tasks import EvalItem, EvalTask, chat_item

BENCH_TASKS = ("counting", "arithmetic", "listops", "code", "text")
HEADLINE_PROMPT = "Count from 1 to 200."
TEXT_PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Describe a walk through a forest in autumn.",
    "Explain why the sky is blue to a child.",
    "Write a letter to a friend about your last holiday.",
    "What makes a good teacher? Give your opinion.",
    "Describe the city you would most like to visit and why.",
    "Write a poem about the sea.",
    "Tell me about your favourite book.",
]
# (full, quick) generation budgets; 1..200 is 890 tokens with the shipped tokenizer.
MAX_TOKENS = {"counting": (1024, 256), "arithmetic": (32, 32), "listops": (48, 48), "code": (128, 48),
              "text": (128, 48)}


def curriculum_items(task: str, n: int) -> list[EvalItem]:
    """`n` items of a curriculum task from its test split; the reference is the example."""
    return [example_item(ex, f"{task}/{i}") for i, ex in enumerate(heldout_examples(task, n))]


def counting_items(n: int, quick: bool) -> list[EvalItem]:
    """The headline prompt first (full runs), then held-out counting prompts (short ones if quick)."""
    if not quick:
        headline = example_item({"task": "count", "op": "up", "prompt": HEADLINE_PROMPT,
                                 "answer": ", ".join(map(str, range(1, 201))), "final": None}, "counting/headline")
        return [headline] + curriculum_items("count", n - 1) if n > 1 else [headline]
    draw = 4 * n
    while True:  # test draws are prefix-stable, so drawing more only appends
        pool = [i for i in curriculum_items("count", draw) if len(i.reference["answer"]) <= 150]
        if len(pool) >= n:
            return pool[:n]
        draw *= 2


def code_items(n: int, seed: int = 0) -> list[EvalItem]:
    """Held-out stdlib chunks cut at a random line: prompt = the head, reference = the rest."""
    from wedlm.data.build import code_completion_record
    from wedlm.data.code_corpus import code_chunks

    rng, items = random.Random(f"bench-code:{seed}"), []
    for chunk in code_chunks("heldout"):
        record = code_completion_record(chunk, rng, max_chars=800)
        if record is None:
            continue
        user, rest = record["messages"][0]["content"], record["messages"][1]["content"]
        items.append(chat_item(f"code/{chunk.path}:{chunk.index}", user, rest,
                               raw=user.split("\n", 1)[1]))
        if len(items) == n:
            break
    return items


def text_items(n: int) -> list[EvalItem]:
    """Open-ended prompts (cycled when n exceeds the list)."""
    return [chat_item(f"text/{i}", TEXT_PROMPTS[i % len(TEXT_PROMPTS)]) for i in range(n)]


def bench_task(name: str, n: int, quick: bool = False, max_tokens: int | None = None) -> EvalTask:
    """The bench task `name` with `n` items.

    Raises:
        ValueError: `name` not in `BENCH_TASKS`.
    """
    if name not in BENCH_TASKS:
        raise ValueError(f"unknown bench task {name!r}; expected one of {BENCH_TASKS}")
    budget = max_tokens or MAX_TOKENS[name][1 if quick else 0]
    if name == "counting":
        return EvalTask("counting", counting_items(n, quick), score_item, budget, kind="low-entropy")
    if name == "arithmetic":
        return EvalTask("arithmetic", curriculum_items("addsub", n), score_item, budget, kind="reasoning")
    if name == "listops":
        return EvalTask("listops", curriculum_items("listops", n), score_item, budget, kind="list-operations")
    if name == "code":
        return EvalTask("code", code_items(n), None, budget, kind="code")
    return EvalTask("text", text_items(n), None, budget, kind="open-ended")
