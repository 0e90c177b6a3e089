"""Reader of ParallelBench-layout files: hand-made task_config.yaml + JSONL become listops tasks with
filled prompts, demonstrations, exact and validity references; malformed files fail naming the place."""

import json
import re

import pytest
import yaml

from wedlm.cli.main import main
from wedlm.evaluate.parallelbench import parallelbench_tasks

CONFIG = {
    "people/reverse": {"type": "reverse", "metric": "list_match_score",
                       "prompt": "Reverse this line:\n{context}\nOnly the list."},
    "people/insert_index": {"type": "insert", "metric": "list_match_score",
                            "prompt": 'Put "{word}" at position {index} of {context}.'},
    "people/shuffle": {"type": "shuffle", "metric": "list_shuffle_score", "prompt": "Shuffle {context}."},
    "people/replace_random": {"type": "replace", "metric": "list_random_replace_score",
                              "prompt": 'Replace one person in {context} with "{word}".'},
    "people/latin": {"type": "latin_square", "metric": "latin_square_score", "prompt": "Square {size}."},
}
RECORDS = {
    "reverse": [{"input": {"context": '["Ann Lee", "Bo Kim", "Cy Fox"]',
                           "icl_examples": [{"input": {"context": '["X Y", "Z W"]'}, "answer": '["Z W", "X Y"]'}]},
                 "answer": '["Cy Fox", "Bo Kim", "Ann Lee"]', "metadata": {"length": 3}}],
    "insert_index": [{"input": {"context": '["A", "B"]', "word": "W", "index": 1}, "answer": '["A", "W", "B"]',
                      "metadata": {"length": 2}}],
    "shuffle": [{"input": {"context": '["A", "B", "C"]'},
                 "answer": {"input": ["A", "B", "C"], "example": '["C", "A", "B"]'}, "metadata": {"length": 3}}],
    "replace_random": [{"input": {"context": '["A", "B", "C"]', "word": "W"},
                        "answer": {"input": ["A", "B", "C"], "word": "W", "example": '["A", "W", "C"]'},
                        "metadata": {"length": 3}}] * 3,
}


def write_layout(root, config=CONFIG, records=RECORDS):
    folder = root / "test" / "people"
    folder.mkdir(parents=True)
    (folder / "task_config.yaml").write_text(yaml.safe_dump(config))
    for task, recs in records.items():
        (folder / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return root


def by_name(tasks):
    return {t.name: t for t in tasks}


def test_reads_list_tasks_with_prompts_demos_and_references(tmp_path, capsys):
    tasks = by_name(parallelbench_tasks(write_layout(tmp_path)))
    assert sorted(tasks) == ["listops/people/insert_index", "listops/people/replace_random",
                             "listops/people/reverse", "listops/people/shuffle"]
    assert "people/latin" in capsys.readouterr().err  # other families are skipped, with a note
    rev = tasks["listops/people/reverse"].items[0]
    assert rev.messages == [
        {"role": "user", "content": 'Reverse this line:\n["X Y", "Z W"]\nOnly the list.'},
        {"role": "assistant", "content": '["Z W", "X Y"]'},
        {"role": "user", "content": 'Reverse this line:\n["Ann Lee", "Bo Kim", "Cy Fox"]\nOnly the list.'}]
    assert rev.raw == ('Reverse this line:\n["X Y", "Z W"]\nOnly the list.\n["Z W", "X Y"]\n\n'
                       'Reverse this line:\n["Ann Lee", "Bo Kim", "Cy Fox"]\nOnly the list.\n')
    assert rev.reference["gold"] == ["Cy Fox", "Bo Kim", "Ann Lee"]
    ins = tasks["listops/people/insert_index"].items[0]
    assert ins.messages[-1]["content"] == 'Put "W" at position 1 of ["A", "B"].'
    assert ins.reference["kind"] == "exact" and ins.reference["gold"] == ["A", "W", "B"]
    shuffle = tasks["listops/people/shuffle"]
    assert shuffle.items[0].reference == {"kind": "shuffle", "gold": None, "original": ["A", "B", "C"],
                                          "word": None}
    assert shuffle.raw_stop == ["\n\n"] and shuffle.max_tokens == 256


def test_scores_of_read_items(tmp_path):
    tasks = by_name(parallelbench_tasks(write_layout(tmp_path), limit=2))
    rev, shuf = tasks["listops/people/reverse"], tasks["listops/people/shuffle"]
    rep = tasks["listops/people/replace_random"]
    assert len(rep.items) == 2  # --limit
    assert rev.score(rev.items[0], '["Cy Fox", "Bo Kim", "Ann Lee"]').correct
    assert not rev.score(rev.items[0], '["Cy Fox", "Ann Lee", "Bo Kim"]').correct
    assert shuf.score(shuf.items[0], '["B", "C", "A"]').correct
    assert not shuf.score(shuf.items[0], '["A", "B", "C"]').correct
    assert rep.score(rep.items[0], '["W", "B", "C"]').correct  # any one position, to the given word
    assert not rep.score(rep.items[0], '["W", "W", "C"]').correct


@pytest.mark.parametrize("change, message", [
    (lambda c, r: c["people/reverse"].update(metric="list_magic"), "has metric 'list_magic'"),
    (lambda c, r: c["people/reverse"].update(prompt="Reverse {context} then {index}"),
     "uses {index} but the item has no input.index"),
    (lambda c, r: r["reverse"][0].update(answer="not json"), "people/reverse line 1: answer: not a JSON list"),
    (lambda c, r: r["reverse"][0]["input"].pop("context"), "input.context is missing"),
])
def test_malformed_files_name_the_place(tmp_path, change, message):
    config, records = json.loads(json.dumps(CONFIG)), json.loads(json.dumps(RECORDS))
    change(config, records)
    with pytest.raises(ValueError, match=re.escape(message)):
        parallelbench_tasks(write_layout(tmp_path, config, records))


def test_folder_without_list_tasks_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        parallelbench_tasks(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no list task"):
        parallelbench_tasks(write_layout(tmp_path, {"people/latin": CONFIG["people/latin"]}, {}))


def test_eval_cli_reads_data_dir(ckpt_factory, tmp_path, capsys):
    path = ckpt_factory("eval-wedlm", wedlm=True, tokenizer=True, vocab_size=260)
    data, out = write_layout(tmp_path / "pb"), tmp_path / "pb.json"
    rc = main(["eval", "--model", str(path), "--tasks", "listops", "--data", str(data), "--limit", "1",
               "--max-tokens", "3", "--decoding", "ar,verified", "--threads", "1", "--out", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["listops"]
    assert [r["task"] for r in rows] == ["listops/people/insert_index", "listops/people/replace_random",
                                         "listops/people/reverse", "listops/people/shuffle"]
    assert all(r["wedlm"] is None and r["verified_equals_ar"] is True for r in rows)
    capsys.readouterr()
    assert main(["eval", "--model", str(path), "--tasks", "listops", "--data", str(tmp_path / "nope")]) == 2
    assert re.search("wedlm eval: error: task listops: --data .*not a folder", capsys.readouterr().err)
