"""The shipped model's own held-out suites: the curriculum's test split, one scorer per task.

What: `count` ("Count from A to B." and its forms), `addsub` (two-digit sums and
differences) and `listops` (copy / reverse / sort / insert / remove / replace on short
name lists) from `wedlm.data.curriculum.examples(task, n, "test")`, the split that
training and decoding tuning never see. Test draws are prefix-stable, so the first n
items of a task are the same whoever asks: `wedlm eval` (its default suites), `wedlm
bench` and recipes/eval_wedlm_tiny.py (the model card's table) score the same items by
the same rules:

* count: the whole answer, exactly (whitespace at the ends ignored);
* addsub: the last integer of the answer equals the result;
* listops: the answer states the same list (`listops.same_list`).

Why: a model card number is only checkable when the command a user runs scores the same
items by the same rule; a second scorer per task would drift.
"""

from __future__ import annotations

import json
import re

from wedlm.data import curriculum

from .listops import parse_list, same_list
from .tasks import EvalItem, EvalTask, Score, chat_item

CURRICULUM_TASKS = ("count", "addsub", "listops")
# Budgets cover each task's longest answer: counting runs to 150 terms of up to 4 digits.
MAX_TOKENS = {"count": 1024, "addsub": 32, "listops": 48}
KINDS = {"count": "low-entropy", "addsub": "reasoning", "listops": "list-operations"}


def score_count(text: str, ex: dict) -> bool:
    """The listing exactly as the answer (whitespace at the ends ignored)."""
    return text.strip() == ex["answer"]


def score_addsub(text: str, ex: dict) -> bool:
    """The last integer of the text is the result."""
    numbers = re.findall(r"-?\d+", text)
    return bool(numbers) and numbers[-1] == ex["final"]


def score_listops(text: str, ex: dict) -> bool:
    """The text states the answer's list (`listops.same_list`)."""
    return same_list(text, ex["answer"])


SCORERS = {"count": score_count, "addsub": score_addsub, "listops": score_listops}


def score_example(ex: dict, text: str) -> bool:
    """True when `text` answers the curriculum example `ex` ({"task", "answer", "final", ...}).

    Raises:
        ValueError: `ex["task"]` is not a curriculum task.
    """
    scorer = SCORERS.get(ex.get("task"))
    if scorer is None:
        raise ValueError(f"curriculum task must be one of {CURRICULUM_TASKS}, got {ex.get('task')!r}")
    return scorer(text, ex)


def predicted(ex: dict, text: str) -> str | None:
    """What the scorer read from `text`: the last integer (addsub), the list as JSON (listops),
    the listing's tail (count)."""
    if ex["task"] == "addsub":
        numbers = re.findall(r"-?\d+", text)
        return numbers[-1] if numbers else None
    if ex["task"] == "listops":
        got = parse_list(text)
        return None if got is None else json.dumps(got)
    return text.strip()[-40:]


def score_item(item: EvalItem, text: str) -> Score:
    """`score_example` for an `EvalItem` whose reference is the curriculum example."""
    return Score(correct=score_example(item.reference, text), predicted=predicted(item.reference, text))


def example_item(ex: dict, id: str) -> EvalItem:
    """The example as one user turn; the reference is the example itself."""
    return chat_item(id, ex["prompt"], dict(ex))


def heldout_examples(task: str, n: int) -> list[dict]:
    """The first `n` TEST-split examples of `task`.

    Raises:
        ValueError: an unknown task or `n` < 1.
    """
    if task not in CURRICULUM_TASKS:
        raise ValueError(f"curriculum task must be one of {CURRICULUM_TASKS}, got {task!r}")
    if n < 1:
        raise ValueError(f"items per task must be >= 1, got {n}")
    return curriculum.examples(task, n, "test")


def curriculum_task(task: str, n: int, max_tokens: int | None = None, name: str | None = None) -> EvalTask:
    """The first `n` test items of `task` as one `EvalTask` (named `name`, default `task`)."""
    items = [example_item(ex, f"{task}/{i}") for i, ex in enumerate(heldout_examples(task, n))]
    return EvalTask(name=name or task, items=items, score=score_item,
                    max_tokens=max_tokens or MAX_TOKENS[task], kind=KINDS[task])


def curriculum_tasks_by_op(task: str, n: int, max_tokens: int | None = None) -> list[EvalTask]:
    """The first `n` test items of `task`, one `EvalTask` per operation ("count/up",
    "addsub/sub", "listops/copy", ...) in first-seen order: the rows of the model card."""
    groups: dict[str, list[EvalItem]] = {}
    for i, ex in enumerate(heldout_examples(task, n)):
        groups.setdefault(ex["op"], []).append(example_item(ex, f"{task}/{ex['op']}/{i}"))
    return [EvalTask(name=f"{task}/{op}", items=items, score=score_item,
                     max_tokens=max_tokens or MAX_TOKENS[task], kind=KINDS[task])
            for op, items in groups.items()]
