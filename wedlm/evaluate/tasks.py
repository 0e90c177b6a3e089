"""The shape every evaluation task shares: items with a prompt, a reference and a scorer.

What: `EvalItem` (one prompt, given both as chat messages and as raw text, plus
its reference answer) and `EvalTask` (items, generation limits, a `score`
function from generated text to a `Score`).

Why: the runner, the benchmark and the tests treat HumanEval, GSM8K, MATH and
the synthetic suites alike; only item building and scoring differ per task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class EvalItem:
    """One prompt of a task.

    Attributes:
        id: stable identifier (e.g. "HumanEval/0", "gsm8k/12").
        messages: the prompt as chat messages (used when the tokenizer has a chat template).
        raw: the prompt as plain text for base models (no template).
        reference: what `EvalTask.score` compares against (gold number, answer text, problem dict).
    """

    id: str
    messages: list[dict]
    raw: str
    reference: Any = None


@dataclass(slots=True)
class Score:
    """Outcome of scoring one generation: `correct`, the extracted `predicted` answer, a `detail`."""

    correct: bool
    predicted: str | None = None
    detail: str = ""


@dataclass(slots=True)
class EvalTask:
    """A named list of items with generation limits and a scorer.

    Attributes:
        name: task name as shown in reports.
        items: the prompts.
        score: (item, generated text) -> Score; None for speed-only tasks (no accuracy).
        max_tokens: generation budget per item.
        stop: extra stop strings (besides the tokenizer's stop tokens) in both prompt styles.
        raw_stop: extra stop strings only for raw (base-model) prompts, e.g. "\\nQuestion:".
        kind: "low-entropy" | "reasoning" | "code" | "open-ended" (how the paper groups speed-ups).
    """

    name: str
    items: list[EvalItem]
    score: Callable[[EvalItem, str], Score] | None
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    raw_stop: list[str] = field(default_factory=list)
    kind: str = "reasoning"

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.items:
            raise ValueError(f"task {self.name!r} has no items")


def chat_item(id: str, user: str, reference: Any = None, raw: str | None = None) -> EvalItem:
    """An item whose chat form is a single user turn and whose raw form is `raw` (default `user + "\\n"`)."""
    return EvalItem(id=id, messages=[{"role": "user", "content": user}],
                    raw=user + "\n" if raw is None else raw, reference=reference)
