"""One scorer per curriculum task: `wedlm eval`'s default suites, `wedlm bench` and the eval
recipe read the same test items and score them by `wedlm.evaluate.curriculum`."""

import pytest

from wedlm.cli.eval import build_tasks, decoders_for
from wedlm.cli.main import build_parser
from wedlm.data import curriculum
from wedlm.evaluate.curriculum import curriculum_tasks_by_op, score_example, score_item


def test_scorers_on_test_items():
    count, addsub, listops = (curriculum.examples(t, 1, "test")[0] for t in ("count", "addsub", "listops"))
    assert score_example(count, count["answer"] + "\n") and not score_example(count, count["answer"] + ", 9")
    assert score_example(addsub, addsub["answer"]) and score_example(addsub, f"= {addsub['final']}")
    assert not score_example(addsub, f"{addsub['answer']} 1")
    assert score_example(listops, listops["answer"] + ".") and not score_example(listops, "Zed")
    with pytest.raises(ValueError, match="curriculum task must be one of"):
        score_example({"task": "poetry"}, "")


def test_eval_defaults_are_the_model_suites_by_operation():
    args = build_parser().parse_args(["eval"])
    tasks = build_tasks(args)
    families = {t.name.split("/")[0]: 0 for t in tasks}
    for t in tasks:
        families[t.name.split("/")[0]] += len(t.items)
        assert t.score is score_item
    assert families == {"count": 40, "addsub": 40, "listops": 60}
    assert decoders_for(args) == ["ar", "wedlm"]
    first = curriculum.examples("count", 40, "test")  # the first items of the test split, as the recipe reads
    got = {item.reference["prompt"] for t in tasks if t.name.startswith("count/") for item in t.items}
    assert got == {ex["prompt"] for ex in first}


def test_limit_per_task():
    args = build_parser().parse_args(["eval", "--limit", "count=3,listops=2", "--tasks", "count,listops,addsub"])
    sizes = {}
    for t in build_tasks(args):
        sizes[t.name.split("/")[0]] = sizes.get(t.name.split("/")[0], 0) + len(t.items)
    assert sizes == {"count": 3, "listops": 2, "addsub": 40}
    assert [t.name for t in curriculum_tasks_by_op("addsub", 4)] == list(
        dict.fromkeys(f"addsub/{ex['op']}" for ex in curriculum.examples("addsub", 4, "test")))
