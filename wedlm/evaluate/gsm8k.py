"""GSM8K-format and MATH-format JSONL tasks with n-shot prompts and answer extraction.

What:
- GSM8K: records `{"question", "answer"}` whose answer ends with `#### N`.
  Prompts are n-shot ("Question: ...\\nAnswer: <worked answer> #### N"), the shots
  taken from `--shots-file` or, when absent, from the first n records of the
  file (which are then not scored). The prediction is the generation's final
  number (`extract_final_number`: `####` first, then "final answer", then the
  last number).
- MATH: records `{"problem", "solution"}` (the answer is the last `\\boxed{}` of
  the solution) or `{"problem", "answer"}`; the prediction is the generation's
  last `\\boxed{}` (else its final number), compared after `normalize_math_answer`.

Why: the two answer conventions most reasoning benchmarks use; any dataset
exported to these shapes is scored the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..jsonl import read_jsonl
from .extract import extract_boxed, extract_final_number, extract_gsm8k_reference, math_answers_equal, numbers_equal
from .tasks import EvalItem, EvalTask, Score

_CALCULATOR = re.compile(r"<<[^>]*>>")  # GSM8K's "<<48/2=24>>" calculator annotations
QUESTION_STOPS = ["\nQuestion:", "\n\nQuestion", "Question:"]
MATH_INSTRUCTION = "Put the final answer in \\boxed{}."


def clean_gsm8k_answer(answer: str) -> str:
    """A GSM8K answer without calculator annotations, its `#### N` line kept."""
    return _CALCULATOR.sub("", answer).strip()


def _shot_messages(shots: list[dict]) -> list[dict]:
    messages = []
    for shot in shots:
        messages.append({"role": "user", "content": f"Question: {shot['question']}"})
        messages.append({"role": "assistant", "content": clean_gsm8k_answer(shot["answer"])})
    return messages


def gsm8k_item(i: int, record: dict, shots: list[dict]) -> EvalItem:
    """One n-shot item: chat = alternating user/assistant shots then the question; raw = Q/A text."""
    for key in ("question", "answer"):
        if key not in record:
            raise ValueError(f"gsm8k record {i} lacks {key!r}")
    reference = extract_gsm8k_reference(record["answer"])
    if reference is None:
        raise ValueError(f"gsm8k record {i}: answer does not end with '#### N'")
    raw = "".join(f"Question: {s['question']}\nAnswer: {clean_gsm8k_answer(s['answer'])}\n\n" for s in shots)
    raw += f"Question: {record['question']}\nAnswer:"
    messages = _shot_messages(shots) + [{"role": "user", "content": f"Question: {record['question']}"}]
    return EvalItem(id=f"gsm8k/{i}", messages=messages, raw=raw, reference=reference)


def score_gsm8k(item: EvalItem, text: str) -> Score:
    """Final number of the generation vs the `#### N` reference."""
    predicted = extract_final_number(text)
    return Score(correct=numbers_equal(predicted, item.reference), predicted=predicted)


def gsm8k_task(path: str | Path, n_shot: int = 8, limit: int | None = None,
               shots_file: str | Path | None = None, max_tokens: int = 256) -> EvalTask:
    """GSM8K-format JSONL as an n-shot `EvalTask` (see module docstring for where shots come from)."""
    records = read_jsonl(path)
    if shots_file is not None:
        shots = read_jsonl(shots_file)[:n_shot]
    else:
        shots, records = records[:n_shot], records[n_shot:]
    if len(shots) < n_shot:
        raise ValueError(f"{n_shot}-shot prompts need {n_shot} shot records, found {len(shots)}")
    records = records[:limit]
    items = [gsm8k_item(i, r, shots) for i, r in enumerate(records)]
    return EvalTask(name="gsm8k", items=items, score=score_gsm8k, max_tokens=max_tokens,
                    raw_stop=list(QUESTION_STOPS), kind="reasoning")


def math_reference(record: dict) -> str:
    """Gold answer of a MATH record: its `answer`, else the last `\\boxed{}` of its `solution`.

    Raises:
        ValueError: neither is present.
    """
    if record.get("answer") is not None:
        return str(record["answer"])
    boxed = extract_boxed(record.get("solution", ""))
    if boxed is None:
        raise ValueError("MATH record has neither 'answer' nor a \\boxed{} in 'solution'")
    return boxed


def score_math(item: EvalItem, text: str) -> Score:
    """Last `\\boxed{}` of the generation (else its final number) vs the reference."""
    predicted = extract_boxed(text)
    if predicted is None:
        predicted = extract_final_number(text)
    return Score(correct=math_answers_equal(predicted, item.reference), predicted=predicted)


def math_task(path: str | Path, n_shot: int = 0, limit: int | None = None,
              max_tokens: int = 512) -> EvalTask:
    """MATH-format JSONL as an `EvalTask`; shots (if any) are the file's first records."""
    records = read_jsonl(path)
    shots, records = records[:n_shot], records[n_shot:][:limit]
    prefix = "".join(f"Problem: {s['problem']}\nSolution: {s.get('solution') or s['answer']}\n\n" for s in shots)
    items = []
    for i, r in enumerate(records):
        question = f"{r['problem']}\n{MATH_INSTRUCTION}"
        messages = []
        for s in shots:
            messages += [{"role": "user", "content": f"{s['problem']}\n{MATH_INSTRUCTION}"},
                         {"role": "assistant", "content": s.get("solution") or f"\\boxed{{{s['answer']}}}"}]
        messages.append({"role": "user", "content": question})
        items.append(EvalItem(id=f"math/{i}", messages=messages,
                              raw=f"{prefix}Problem: {r['problem']}\nSolution:", reference=math_reference(r)))
    return EvalTask(name="math", items=items, score=score_math, max_tokens=max_tokens,
                    raw_stop=["\nProblem:"], kind="reasoning")
