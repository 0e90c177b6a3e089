"""HumanEval path: the package's problems, completion clean-up, execution by its harness."""

import pytest

from wedlm.evaluate.humaneval import CHAT_INSTRUCTION, clean_completion, humaneval_task, load_problems, score_humaneval
from wedlm.evaluate.tasks import EvalItem


@pytest.fixture(scope="module")
def problems():
    return load_problems()


def test_package_ships_all_problems(problems):
    assert len(problems) == 164
    first = problems["HumanEval/0"]
    assert first["entry_point"] == "has_close_elements"
    assert set(first) >= {"prompt", "canonical_solution", "test", "entry_point"}


def _item(problem):
    return EvalItem(id=problem["task_id"], messages=[], raw=problem["prompt"], reference=problem)


def test_known_correct_completion_passes(problems):
    problem = problems["HumanEval/0"]
    score = score_humaneval(_item(problem), problem["canonical_solution"])
    assert score.correct is True
    assert score.detail == "passed"


def test_known_wrong_completion_fails(problems):
    problem = problems["HumanEval/0"]
    score = score_humaneval(_item(problem), "    return False\n")
    assert score.correct is False
    assert score.detail.startswith("failed")


def test_fenced_full_function_passes(problems):
    problem = problems["HumanEval/2"]  # truncate_number: return number % 1.0
    text = ("Here you go:\n```python\ndef truncate_number(number: float) -> float:\n"
            "    return number % 1.0\n```\nDone.")
    assert clean_completion(problem, text).startswith("\ndef truncate_number")
    assert score_humaneval(_item(problem), text).correct


def test_body_continuation_is_cut_at_codex_stops(problems):
    problem = problems["HumanEval/2"]
    text = "    return number % 1.0\n\n\ndef unrelated():\n    raise SystemExit\nprint('x')\n"
    assert clean_completion(problem, text) == "    return number % 1.0\n"
    assert score_humaneval(_item(problem), text).correct


def test_task_items_have_both_prompt_styles():
    task = humaneval_task(limit=3)
    assert [i.id for i in task.items] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    item = task.items[0]
    assert item.messages[0]["content"].startswith(CHAT_INSTRUCTION)
    assert item.raw == item.reference["prompt"]
    assert "\ndef" in task.raw_stop and task.stop == []
