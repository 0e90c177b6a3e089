"""The shipped model's held-out synthetic suites as evaluation tasks.

What: counting / sequence (exact match of the listed values) and arithmetic /
equation (final number after "Final answer:") built from
`wedlm.data.synthetic.heldout_examples`, i.e. the seed and hash buckets that
training never sees.

Why: these are the tasks the tiny model was trained for, so they measure whether
parallel decoding keeps its quality; counting is also the paper's low-entropy
speed demo (§6.6).
"""

from __future__ import annotations

from wedlm.data import synthetic

from .extract import extract_final_number, numbers_equal
from .tasks import EvalItem, EvalTask, Score, chat_item

SYNTHETIC_TASKS = ("counting", "sequence", "arithmetic", "equation")
# Budgets cover the longest held-out answer of each task with room to spare.
MAX_TOKENS = {"counting": 1024, "sequence": 320, "arithmetic": 160, "equation": 96}
KINDS = {"counting": "low-entropy", "sequence": "low-entropy", "arithmetic": "reasoning",
         "equation": "reasoning"}


def normalize_listing(text: str) -> str:
    """Whitespace-insensitive form of a listing answer: lines stripped, blank lines and spaces collapsed."""
    lines = (" ".join(line.split()) for line in text.strip().splitlines())
    return "\n".join(line for line in lines if line)


def score_listing(item: EvalItem, text: str) -> Score:
    """Exact match of the whole answer (counting, sequences), up to whitespace."""
    got = normalize_listing(text)
    return Score(correct=got == normalize_listing(item.reference), predicted=got[-40:])


def score_final_number(item: EvalItem, text: str) -> Score:
    """The generation's final number (see `extract_final_number`) equals the gold one."""
    predicted = extract_final_number(text)
    return Score(correct=numbers_equal(predicted, item.reference), predicted=predicted)


def synthetic_items(task: str, n: int) -> list[EvalItem]:
    """`n` held-out items of `task`; the reference is the full answer (listings) or the final number."""
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; expected one of {SYNTHETIC_TASKS}")
    items = []
    for i, ex in enumerate(synthetic.heldout_examples(task, n)):
        reference = ex["final"] if ex["final"] is not None else ex["answer"]
        items.append(chat_item(f"{task}/{i}", ex["prompt"], reference))
    return items


def synthetic_task(task: str, n: int = 50, max_tokens: int | None = None) -> EvalTask:
    """The held-out suite `task` with `n` items as an `EvalTask`."""
    scorer = score_final_number if task in ("arithmetic", "equation") else score_listing
    return EvalTask(name=task, items=synthetic_items(task, n), score=scorer,
                    max_tokens=max_tokens or MAX_TOKENS[task], kind=KINDS[task])
