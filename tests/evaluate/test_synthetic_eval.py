"""Held-out synthetic suites as evaluation tasks, and the metric sums of Eq. 4."""

from wedlm.data import synthetic
from wedlm.evaluate.metrics import aggregate
from wedlm.evaluate.runner import cut_at_stops
from wedlm.evaluate.synthetic import synthetic_task


def test_items_are_the_heldout_examples():
    task = synthetic_task("arithmetic", n=5)
    examples = synthetic.heldout_examples("arithmetic", 5)
    assert [i.messages[0]["content"] for i in task.items] == [e["prompt"] for e in examples]
    assert [i.reference for i in task.items] == [e["final"] for e in examples]
    assert task.kind == "reasoning"


def test_scoring_reference_answers_is_perfect_and_wrong_ones_fail():
    for name in ("counting", "sequence", "arithmetic", "equation"):
        task = synthetic_task(name, n=4)
        examples = synthetic.heldout_examples(name, 4)
        assert all(task.score(i, e["answer"]).correct for i, e in zip(task.items, examples)), name
        assert not task.score(task.items[0], "0, 0\nFinal answer: -12345").correct, name


def test_counting_match_ignores_whitespace_only():
    task = synthetic_task("counting", n=1)
    answer = task.items[0].reference
    assert task.score(task.items[0], "  " + answer.replace(", ", ",  ") + "\n").correct
    assert not task.score(task.items[0], answer + ", 1000").correct


def test_aggregate_is_ratio_of_sums():
    stats = [{"decode_tokens": 100, "decode_forwards": 10, "p_cache": 0.5, "ttft_s": 0.2},
             {"decode_tokens": 10, "decode_forwards": 10, "p_cache": 1.0, "ttft_s": 0.4}]
    row = aggregate(stats, wall_s=2.0)
    assert row["tokens_per_forward"] == 110 / 20
    assert row["p_cache"] == 110 / (200 + 10)
    assert row["tokens_per_s"] == 55.0
    assert abs(row["ttft_s"] - 0.3) < 1e-12 and row["ttft_max_s"] == 0.4


def test_cut_at_stops():
    assert cut_at_stops("a\nQuestion: b", ["\nQuestion:", "zz"]) == "a"
    assert cut_at_stops("abc", []) == "abc"
