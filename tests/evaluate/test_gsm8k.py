"""GSM8K / MATH JSONL tasks: n-shot prompts, references and scoring on hand-written records."""

import json

import pytest

from wedlm.evaluate.gsm8k import gsm8k_task, math_task, read_jsonl

GSM = [
    {"question": "Tom has 3 apples and buys 2 more. How many?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"},
    {"question": "A box holds 4 pens. How many pens in 3 boxes?", "answer": "4 x 3 = <<4*3=12>>12\n#### 12"},
    {"question": "Mia had 1,000 coins and spent 1. How many left?", "answer": "1000 - 1 = 999\n#### 999"},
    {"question": "What is 6 times 7?", "answer": "#### 42"},
]


def _write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    return path


def test_gsm8k_shots_come_from_the_head_of_the_file(tmp_path):
    task = gsm8k_task(_write(tmp_path / "g.jsonl", GSM), n_shot=2)
    assert [i.reference for i in task.items] == ["999", "42"]
    raw = task.items[0].raw
    assert raw.startswith("Question: Tom has 3 apples")
    assert "<<" not in raw and "#### 5\n\nQuestion: A box" in raw
    assert raw.endswith("Question: Mia had 1,000 coins and spent 1. How many left?\nAnswer:")
    roles = [m["role"] for m in task.items[0].messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert "\nQuestion:" in task.raw_stop


def test_gsm8k_shots_file_and_limit(tmp_path):
    shots = _write(tmp_path / "shots.jsonl", GSM[:1])
    task = gsm8k_task(_write(tmp_path / "g.jsonl", GSM), n_shot=1, shots_file=shots, limit=2)
    assert [i.reference for i in task.items] == ["5", "12"]


def test_gsm8k_scoring(tmp_path):
    task = gsm8k_task(_write(tmp_path / "g.jsonl", GSM), n_shot=0)
    item = task.items[2]
    assert task.score(item, "1000 - 1 = 999\n#### 999").correct
    assert task.score(item, "The answer is 999.").correct
    wrong = task.score(item, "1000 - 1 = 998\n#### 998")
    assert not wrong.correct and wrong.predicted == "998"


def test_gsm8k_errors(tmp_path):
    with pytest.raises(ValueError, match="#### N"):
        gsm8k_task(_write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "5"}]), n_shot=0)
    with pytest.raises(ValueError, match="need 8 shot"):
        gsm8k_task(_write(tmp_path / "few.jsonl", GSM), n_shot=8)
    (tmp_path / "broken.jsonl").write_text("{not json}\n")
    with pytest.raises(ValueError, match="broken.jsonl:1"):
        read_jsonl(tmp_path / "broken.jsonl")


def test_math_reference_and_scoring(tmp_path):
    records = [{"problem": "What is 1/2 + 0?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
               {"problem": "2+2?", "answer": "4"}]
    task = math_task(_write(tmp_path / "m.jsonl", records))
    assert [i.reference for i in task.items] == ["\\frac{1}{2}", "4"]
    assert task.items[0].messages[-1]["content"].endswith("\\boxed{}.")
    assert task.score(task.items[0], "so \\boxed{\\dfrac12}").correct
    assert task.score(task.items[0], "the result is 0.5").correct
    assert not task.score(task.items[1], "\\boxed{5}").correct
