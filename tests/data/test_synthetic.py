"""Tests for wedlm.data.synthetic: determinism, the held-out split and exact answers.

Every answer is re-derived here from the prompt text alone, independently of
the generator, so a wrong answer in the training data cannot slip through.
"""

import re
import string

import pytest

from wedlm.data import synthetic as syn

N = 3000


def _counting_key(ex: dict) -> tuple[int, int, int]:
    values = [int(v) for v in ex["answer"].split(", ")]
    lo, hi = min(values), max(values)
    step = abs(values[1] - values[0]) if len(values) > 1 else 1
    return lo, hi, step


def _expected_counting(prompt: str) -> list[int]:
    m = re.fullmatch(r"[Cc]ount down from (\d+) to (\d+)(?: in steps of (\d+))?\.?", prompt)
    if m:
        hi, lo, step = int(m[1]), int(m[2]), int(m[3] or 1)
        return list(range(lo, hi + 1, step))[::-1]
    m = re.fullmatch(r"(?:[Cc]ount from|List the numbers from|List the (?:even|odd) numbers from)"
                     r" (\d+) to (\d+)(?: in steps of (\d+))?\.?", prompt)
    assert m, prompt
    step = int(m[3] or (2 if "even" in prompt or "odd" in prompt else 1))
    if "even" in prompt:
        assert int(m[1]) % 2 == 0 and int(m[2]) % 2 == 0
    if "odd" in prompt:
        assert int(m[1]) % 2 == 1 and int(m[2]) % 2 == 1
    return list(range(int(m[1]), int(m[2]) + 1, step))


def _solve_word_problem(prompt: str) -> int:
    total = None
    for sentence in re.split(r"(?<=[.?])\s+", prompt):
        if m := re.fullmatch(r"\w+ has (\d+) \w+\.", sentence):
            total = int(m[1])
        elif m := re.fullmatch(r"\w+ buys (\d+) \w+ of (\d+) \w+\.", sentence):
            total += int(m[1]) * int(m[2])
        elif m := re.fullmatch(r"\w+ finds (\d+) more \w+\.", sentence):
            total += int(m[1])
        elif m := re.fullmatch(r"\w+ gives away (\d+) \w+\.", sentence):
            total -= int(m[1])
        elif m := re.fullmatch(r"Then the number of \w+ \w+ has (doubles|triples)\.", sentence):
            total *= 2 if m[1] == "doubles" else 3
        else:
            assert re.fullmatch(r"How many \w+ does \w+ have now\?", sentence), sentence
    return total


def _solve_arithmetic(prompt: str) -> int:
    if prompt.startswith("Compute "):
        expr = prompt[len("Compute "):-1]
        assert re.fullmatch(r"[\d()+\-x ]+", expr), expr
        return eval(expr.replace("x", "*"))  # only digits, brackets and + - * survive the check
    return _solve_word_problem(prompt)


def _check_step_lines(answer: str) -> int:
    """Every non-final line is ``a op b = c`` with c correct; returns the last c."""
    *steps, last = answer.split("\n")
    assert 2 <= len(steps) <= 4
    ops = {"+": int.__add__, "-": int.__sub__, "x": int.__mul__}
    for line in steps:
        m = re.fullmatch(r"(\d+) ([+\-x]) (\d+) = (\d+)", line)
        assert m, line
        assert ops[m[2]](int(m[1]), int(m[3])) == int(m[4]), line
    assert re.fullmatch(r"Final answer: -?\d+", last)
    return int(m[4])


def test_same_seed_same_examples_and_seeds_differ():
    for task in syn.TASKS:
        a = syn.sample_examples(task, 50, seed=7)
        assert a == syn.sample_examples(task, 50, seed=7)
        assert a != syn.sample_examples(task, 50, seed=8)
        assert syn.train_examples(task, 20, offset=3) == syn.sample_examples(task, 20, 1237)


def test_example_schema():
    for task in syn.TASKS:
        for ex in syn.train_examples(task, 50):
            assert set(ex) == {"task", "prompt", "answer", "final"} and ex["task"] == task
            assert (ex["final"] is not None) == (task in ("arithmetic", "equation"))


def test_heldout_seed_refused_for_training():
    with pytest.raises(ValueError):
        syn.sample_examples("counting", 1, seed=syn.HELDOUT_SEED)
    with pytest.raises(ValueError):
        syn.sample_examples("nope", 1, seed=1)


def test_counting_heldout_ranges_never_in_training():
    held = {_counting_key(e) for e in syn.heldout_examples("counting", 200)}
    train = {_counting_key(e) for off in range(3) for e in syn.train_examples("counting", N, off)}
    assert len(held) > 150
    assert held.isdisjoint(train)
    assert (1, 200, 1) in train and (1, 200, 1) not in held


@pytest.mark.parametrize("task", ["arithmetic", "equation", "sequence"])
def test_heldout_prompts_never_in_training(task):
    held = {e["prompt"] for e in syn.heldout_examples(task, 200)}
    train = {e["prompt"] for off in range(3) for e in syn.train_examples(task, N, off)}
    assert held.isdisjoint(train)
    assert all(syn.is_heldout_key(p) for p in held)


def test_heldout_examples_are_fixed():
    assert syn.heldout_examples("equation", 5) == syn.sample_examples("equation", 5, 999_999, "heldout")


def test_counting_answers_exact():
    examples = syn.train_examples("counting", N) + syn.heldout_examples("counting", 200)
    for ex in examples:
        assert [int(v) for v in ex["answer"].split(", ")] == _expected_counting(ex["prompt"])
        assert ex["answer"] == ", ".join(ex["answer"].split(", "))
    starts = [_counting_key(e)[0] for e in examples]
    lengths = [len(e["answer"].split(", ")) for e in examples]
    assert min(starts) <= 5 and max(starts) >= 290
    assert min(lengths) == 1 and max(lengths) >= 195


def test_count_1_to_200_is_frequent_and_exact():
    examples = syn.train_examples("counting", N)
    hits = [e for e in examples if e["prompt"] in ("Count from 1 to 200.", "count from 1 to 200")]
    assert len(hits) >= 0.03 * N
    assert any(e["prompt"] == "Count from 1 to 200." for e in hits)
    assert hits[0]["answer"] == ", ".join(str(i) for i in range(1, 201))


def test_arithmetic_answers_recomputed():
    for ex in syn.train_examples("arithmetic", N) + syn.heldout_examples("arithmetic", 200):
        last = _check_step_lines(ex["answer"])
        assert _solve_arithmetic(ex["prompt"]) == last == int(ex["final"])
        assert ex["answer"].endswith(f"\nFinal answer: {ex['final']}")
        assert all(int(v) < 100 for v in re.findall(r"\d+", ex["prompt"]))


def test_equation_answers_recomputed():
    for ex in syn.train_examples("equation", N) + syn.heldout_examples("equation", 200):
        m = re.fullmatch(r"Solve (\d*)x(?: ([+-]) (\d+))? = (-?\d+)\.", ex["prompt"])
        assert m, ex["prompt"]
        a, sign, b, c = int(m[1] or 1), m[2] or "+", int(m[3] or 0), int(m[4])
        rhs = c - b if sign == "+" else c + b
        assert rhs % a == 0 and rhs // a == int(ex["final"]) >= 0
        assert ex["answer"].split("\n")[-1] == f"Final answer: {rhs // a}"
        assert ex["answer"].split("\n")[-2].endswith(f"= {rhs // a}")


def test_sequence_answers_exact():
    for ex in syn.train_examples("sequence", 1000):
        p = ex["prompt"]
        if m := re.fullmatch(r"List the letters from (\w) to (\w)\.", p):
            letters = string.ascii_letters
            i, j = letters.index(m[1]), letters.index(m[2])
            assert ex["answer"] == ", ".join(letters[i:j + 1]) and i < j
        elif m := re.fullmatch(r"Write the multiplication table of (\d+) up to (\d+)\.", p):
            n, upto = int(m[1]), int(m[2])
            assert ex["answer"] == "\n".join(f"{n} x {k} = {n * k}" for k in range(1, upto + 1))
        else:
            m = re.fullmatch(r'Repeat the word "(\w+)" (\d+) times\.', p)
            assert m and ex["answer"] == ", ".join([m[1]] * int(m[2]))


def test_renderings():
    ex = {"task": "equation", "prompt": "Solve 2x = 6.", "answer": "x = 6 / 2 = 3\nFinal answer: 3",
          "final": "3"}
    assert syn.to_text(ex) == "Solve 2x = 6.\nx = 6 / 2 = 3\nFinal answer: 3"
    assert syn.to_chat(ex) == {"messages": [{"role": "user", "content": "Solve 2x = 6."},
                                            {"role": "assistant", "content": ex["answer"]}]}
