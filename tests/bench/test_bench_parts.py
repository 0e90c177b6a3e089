"""Bench pieces without a model: task suite, Pareto frontier, target checks, CLI config."""

import argparse

import pytest

from wedlm.bench.plots import pareto_front
from wedlm.bench.report import targets
from wedlm.bench.runner import BenchConfig, strip_stops
from wedlm.bench.tasks import HEADLINE_PROMPT, bench_task
from wedlm.cli import bench as bench_cli


def test_counting_task_starts_with_the_headline_prompt():
    task = bench_task("counting", 3)
    assert task.items[0].messages[0]["content"] == HEADLINE_PROMPT
    assert task.items[0].reference["answer"] == ", ".join(str(i) for i in range(1, 201))
    assert task.score(task.items[0], task.items[0].reference["answer"]).correct
    assert not task.score(task.items[0], task.items[0].reference["answer"] + ", 201").correct
    assert len(task.items) == 3 and task.max_tokens == 1024


def test_quick_counting_prompts_are_short():
    task = bench_task("counting", 8, quick=True)
    assert len(task.items) == 8 and all(len(i.reference["answer"]) <= 150 for i in task.items)
    assert task.max_tokens == 256


def test_curriculum_tasks_come_from_the_test_split():
    from wedlm.data import curriculum

    arith = bench_task("arithmetic", 4)
    test = curriculum.examples("addsub", 4, "test")
    assert [i.messages[0]["content"] for i in arith.items] == [e["prompt"] for e in test]
    assert [i.reference for i in arith.items] == test
    assert arith.score(arith.items[0], test[0]["answer"]).correct
    assert not arith.score(arith.items[0], test[0]["answer"] + "1").correct
    lists = bench_task("listops", 3)
    want = curriculum.examples("listops", 3, "test")
    assert [i.reference for i in lists.items] == want and lists.max_tokens == 48
    assert lists.score(lists.items[0], want[0]["answer"]).correct
    assert not lists.score(lists.items[0], want[0]["answer"] + ", Tom").correct


def test_code_and_text_tasks_are_speed_only():
    code = bench_task("code", 2)
    assert code.score is None and len(code.items) == 2
    assert code.items[0].messages[0]["content"].startswith("Complete this Python code:\n")
    assert code.items[0].reference  # the held-out continuation
    text = bench_task("text", 10)
    assert text.score is None and len(text.items) == 10
    with pytest.raises(ValueError, match="unknown bench task"):
        bench_task("poetry", 1)


def test_pareto_front():
    pts = [(1.0, 90.0), (2.0, 85.0), (1.5, 80.0), (3.0, 60.0), (2.0, 70.0)]
    assert pareto_front(pts) == [(1.0, 90.0), (2.0, 85.0), (3.0, 60.0)]


def test_strip_stops():
    assert strip_stops([5, 6, 2, 2], {2}) == [5, 6]
    assert strip_stops([2, 5], {2}) == [2, 5]


def _row(task, system, decoding, tau, **kw):
    base = {"task": task, "batch_size": 1, "system": system, "decoding": decoding, "tau": tau, "lam": 0.02,
            "tokens_per_s": 100.0, "accuracy": None, "same_as_ar": 1.0, "speedup_vs_ar": 1.0,
            "wall_speedup_vs_ar": 1.0, "wall_speedup_vs_transformers": 1.0}
    base.update(kw)
    return base


def test_targets_pick_the_fastest_accurate_setting():
    result = {"config": {"lambdas": [0.02]}, "results": [
        _row("counting", "wedlm t=0.9 l=0.02", "wedlm", 0.9, speedup_vs_ar=7.0, wall_speedup_vs_ar=6.5,
             wall_speedup_vs_transformers=20.0, tokens_per_s=700.0),
        _row("counting", "blockwise t=0.9", "blockwise", 0.9, tokens_per_s=350.0),
        _row("counting", "verified", "verified", None, wall_speedup_vs_ar=2.5, same_as_ar=1.0),
        _row("counting", "ar", "ar", None),
        # arithmetic: the faster setting loses 10 points, so the slower accurate one is judged
        _row("arithmetic", "wedlm t=0.9 l=0.02", "wedlm", 0.9, speedup_vs_ar=4.0, wall_speedup_vs_ar=4.0,
             accuracy=0.80),
        _row("arithmetic", "wedlm t=0.4 l=0.02", "wedlm", 0.4, speedup_vs_ar=2.0, wall_speedup_vs_ar=2.0,
             accuracy=0.90),
        _row("arithmetic", "ar", "ar", None, accuracy=0.91),
    ]}
    got = {t["claim"]: t for t in targets(result)}
    assert got["counting: wall clock vs ar"]["value"] == 6.5 and got["counting: wall clock vs ar"]["met"]
    assert got["counting: wall clock vs transformers generate"]["met"]
    arith = got["arithmetic: wall clock vs ar, accuracy within 2 points"]
    assert arith["system"] == "wedlm t=0.4 l=0.02" and arith["value"] == 2.0 and not arith["met"]
    assert got["counting: streaming vs blockwise at tau=0.9 (tok/s)"]["value"] == 2.0
    assert got["counting: verified vs ar wall clock, identical output"]["met"]
    assert all(t["why"] is None for t in got.values())


def test_a_target_without_a_value_says_why():
    """A `wedlm` setting counts only within 2 points of `ar`'s accuracy: with none, the target
    has no value, and the report says so instead of a bare dash."""
    result = {"config": {"lambdas": [0.02]}, "results": [
        _row("counting", "wedlm t=0.9 l=0.02", "wedlm", 0.9, wall_speedup_vs_ar=6.5, accuracy=0.5),
        _row("counting", "ar", "ar", None, accuracy=0.9),
    ]}
    got = {t["claim"]: t for t in targets(result)}
    counting = got["counting: wall clock vs ar"]
    assert counting["value"] is None and not counting["met"]
    assert counting["why"] == "no `wedlm` setting within 2 points of `ar`'s accuracy (or no such rows)"
    assert got["counting: verified vs ar wall clock, identical output"]["why"] == "the run has no such row"


def test_cli_quick_defaults():
    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "--quick", "--model", "m", "--tasks", "counting,text"])
    cfg = bench_cli.config_from_args(args, "wedlm bench --quick")
    assert isinstance(cfg, BenchConfig)
    assert cfg.taus == (0.4, 0.9) and cfg.lambdas == (0.02,) and cfg.repeats == 1
    assert cfg.tasks == ("counting", "text") and cfg.batch_sizes == (1, 8)
    full = bench_cli.config_from_args(parser.parse_args(["bench", "--taus", "0.3,0.6", "--batch-sizes", "1"]))
    assert full.taus == (0.3, 0.6) and full.batch_sizes == (1,) and full.repeats == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--taus", "a,b"])
