"""listops: list parsing, validity of random operations, held-out items per operation, the
per-operation table, and `wedlm eval --tasks listops` end to end on a tiny random model."""

import json
import re

import pytest

from wedlm.cli.main import main
from wedlm.data import curriculum
from wedlm.evaluate.listops import (
    list_reference,
    listops_items,
    listops_table,
    listops_tasks,
    parse_list,
    same_list,
    score_list_answer,
    score_list_item,
    valid_random_insert,
    valid_random_remove,
    valid_random_replace,
    valid_shuffle,
)
from wedlm.evaluate.tasks import chat_item


@pytest.mark.parametrize("text, expected", [
    ("Ben, Anna, Tom", ["Ben", "Anna", "Tom"]),
    ("Ben, Anna, Tom.\nmore text", ["Ben", "Anna", "Tom"]),
    ('Sure: ["Eric Reynolds", "Roy Ortiz"]', ["Eric Reynolds", "Roy Ortiz"]),
    ('[a] then ["x", "y"]', ["x", "y"]),
    ("['x', 'y']", ["x", "y"]),  # not JSON: split on commas, quotes stripped
    ('["x", "y"', None),
    ("", None),
])
def test_parse_list(text, expected):
    assert parse_list(text) == expected


def test_validity_of_random_operations():
    orig = ["A", "B", "C"]
    assert valid_shuffle(["C", "A", "B"], orig)
    assert not valid_shuffle(orig, orig)  # unchanged order is not a shuffle
    assert not valid_shuffle(["C", "A", "A"], orig) and not valid_shuffle(["C", "A"], orig)
    assert valid_random_insert(["A", "W", "B", "C"], orig, "W") and valid_random_insert(["A", "B", "C", "W"], orig, "W")
    assert not valid_random_insert(["W", "A", "C", "B"], orig, "W")  # others out of order
    assert not valid_random_insert(["W", "A", "B", "C", "W"], orig, "W")  # inserted twice
    assert not valid_random_insert(["X", "A", "B", "C"], orig, "W")
    assert valid_random_remove(["A", "C"], orig) and valid_random_remove(["B", "C"], orig)
    assert not valid_random_remove(["C", "A"], orig) and not valid_random_remove(["A"], orig)
    assert not valid_random_remove(["A", "X"], orig)
    assert valid_random_replace(["A", "W", "C"], orig, "W") and valid_random_replace(["W", "B", "C"], orig, "W")
    assert not valid_random_replace(["A", "W", "W"], orig, "W")  # two positions changed
    assert not valid_random_replace(["A", "X", "C"], orig, "W")  # changed to the wrong item
    assert not valid_random_replace(orig, orig, "W") and not valid_random_replace(["A", "W"], orig, "W")
    assert valid_random_replace(["A", "X", "C"], orig, None)


def test_score_list_item_dispatches_on_kind():
    exact = chat_item("e", "Reverse the list: A, B.", list_reference("exact", gold=["B", "A"]))
    assert score_list_item(exact, "B, A").correct and not score_list_item(exact, "A, B").correct
    assert score_list_item(exact, "B, A").predicted == '["B", "A"]'
    assert score_list_item(exact, "   ").detail == "no list found"
    shuffle = chat_item("s", "Shuffle", list_reference("shuffle", original=["A", "B"]))
    assert score_list_item(shuffle, '["B", "A"]').correct and not score_list_item(shuffle, '["A", "B"]').correct
    with pytest.raises(ValueError, match="needs the inserted word"):
        list_reference("insert", original=["A"])
    with pytest.raises(ValueError, match="score kind must be one of"):
        list_reference("rotate", gold=["A"])


def test_one_list_rule_for_answers_given_as_text():
    # the curriculum's listops scorer (wedlm eval, wedlm bench, the model card) is this rule
    from wedlm.bench.tasks import bench_task
    from wedlm.evaluate.curriculum import score_item

    assert same_list("Ann,Bo, Cy.\n", "Ann, Bo, Cy") and not same_list("Ann, Cy, Bo", "Ann, Bo, Cy")
    assert not same_list("", "Ann") and not same_list("Ann, Bo", "Ann, Bo, Cy")
    item = chat_item("l", "Repeat the list: Ann, Bo.", "Ann, Bo")
    assert score_list_answer(item, "Ann, Bo").correct and score_list_answer(item, "Ann, Bo").predicted == '["Ann", "Bo"]'
    assert score_list_answer(item, "").predicted is None
    task = bench_task("listops", 3)
    first = task.items[0]
    assert task.score is score_item and task.score(first, first.reference["answer"] + ".").correct
    assert not task.score(first, first.reference["answer"] + ", Zed").correct


def test_listops_items_are_held_out_test_items_of_one_operation():
    test_prompts = {ex["prompt"] for ex in curriculum.examples("listops", 400, "test")}
    for op in curriculum.LIST_OPS:
        items = listops_items(op, 5)
        assert len(items) == 5 and all(i.id.startswith(f"listops/{op}/") for i in items)
        for item in items:
            prompt = item.messages[0]["content"]
            assert prompt in test_prompts and curriculum.split_of(prompt) == "test"
            listing = re.search(r"list: (.*)\.$", prompt).group(1).split(", ")
            pos = re.search(r"position (\d+)", prompt)
            named = re.match(r"Insert (\w+) at", prompt) or re.search(r"with (\w+) in the list", prompt)
            word = named.group(1) if named else None
            gold = curriculum.apply_list_op(op, listing, int(pos.group(1)) if pos else None, word)
            assert item.reference == {"kind": "exact", "gold": gold, "original": None, "word": None}
    tasks = listops_tasks(2)
    assert [t.name for t in tasks] == [f"listops/{op}" for op in curriculum.LIST_OPS]
    with pytest.raises(ValueError, match="list operation must be one of"):
        listops_items("rotate", 1)


def _report(task, decoding, accuracy, tpf=1.0):
    return {"task": task, "n": 4, "accuracy": accuracy, "decode": {"decoding": decoding},
            "metrics": {"tokens_per_forward": tpf}}


def test_listops_table_one_row_per_operation():
    reports = [_report("listops/copy", "ar", 1.0), _report("listops/sort", "ar", 0.5),
               _report("counting", "ar", 0.25),
               _report("listops/copy", "wedlm", 0.75, 2.5), _report("listops/sort", "wedlm", 0.25, 3.0),
               _report("listops/copy", "verified", 1.0), _report("listops/sort", "verified", 0.25)]
    assert listops_table(reports) == [
        {"task": "listops/copy", "n": 4, "ar": 1.0, "wedlm": 0.75, "wedlm_tokens_per_forward": 2.5,
         "verified": 1.0, "verified_equals_ar": True},
        {"task": "listops/sort", "n": 4, "ar": 0.5, "wedlm": 0.25, "wedlm_tokens_per_forward": 3.0,
         "verified": 0.25, "verified_equals_ar": False}]
    assert listops_table(reports[:2])[0]["verified_equals_ar"] is None


def test_verified_must_match_ar_item_by_item_when_all_outputs_are_kept():
    def with_outputs(decoding, outputs):
        r = _report("listops/copy", decoding, 0.5)
        r["n"], r["samples"] = len(outputs), [{"output": o} for o in outputs]
        return r

    same = [with_outputs("ar", ["A, B", "C"]), with_outputs("verified", ["A, B", "C"])]
    assert listops_table(same)[0]["verified_equals_ar"] is True
    swapped = [with_outputs("ar", ["A, B", "C"]), with_outputs("verified", ["A, B", "D"])]
    assert listops_table(swapped)[0]["verified_equals_ar"] is False  # same accuracy, different output


def test_eval_cli_listops_reports_per_operation(ckpt_factory, tmp_path, capsys):
    path = ckpt_factory("eval-wedlm", wedlm=True, tokenizer=True, vocab_size=260)
    out = tmp_path / "listops.json"
    rc = main(["eval", "--model", str(path), "--tasks", "listops", "--limit", "8", "--max-tokens", "4",
               "--threads", "1", "--out", str(out)])
    assert rc == 0
    saved = json.loads(out.read_text())
    first = curriculum.examples("listops", 8, "test")  # --limit 8: the first 8 test items, by operation
    ops = list(dict.fromkeys(ex["op"] for ex in first))
    decoders = [r["decode"]["decoding"] for r in saved["results"]]
    assert decoders == ["ar"] * len(ops) + ["wedlm"] * len(ops) + ["verified"] * len(ops)  # the default for listops
    rows = saved["listops"]
    assert [r["task"] for r in rows] == [f"listops/{op}" for op in ops]
    for row in rows:
        assert row["n"] == sum(ex["op"] == row["task"].split("/")[1] for ex in first)
        assert row["wedlm_tokens_per_forward"] > 0
        assert row["verified"] == row["ar"] and row["verified_equals_ar"] is True
    printed = capsys.readouterr().out
    assert "listops: per operation" in printed and "verified = AR" in printed
