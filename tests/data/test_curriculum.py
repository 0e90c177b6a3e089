"""The tiny model's curriculum: answers recomputed from the prompt, disjoint splits, the count spec."""

import json
import re

import pytest

from wedlm.data import curriculum as cur


def _count_values(prompt: str) -> list[int]:
    m = re.fullmatch(r"Count (down )?from (\d+) to (\d+)(?: in steps of (\d+))?\.", prompt)
    assert m, prompt
    down, a, b, step = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4) or 1)
    return list(range(a, b - 1, -step)) if down else list(range(a, b + 1, step))


def test_count_answers_and_spec():
    exs = cur.examples("count", 3000, "train")
    crossing = 0
    for ex in exs:
        values = [int(v) for v in ex["answer"].split(", ")]
        assert values == _count_values(ex["prompt"])
        assert 3 <= len(values) <= (200 if ex["prompt"] == "Count from 1 to 200." else 150)
        assert min(values) >= 0 and max(values) <= 1100
        crossing += any(len(str(x)) != len(str(y)) for x, y in zip(values, values[1:]))
    assert crossing > 0.3 * len(exs)  # digit-length changes are over-weighted on purpose
    assert sum(ex["prompt"] == "Count from 1 to 200." for ex in exs) > 50
    assert {ex["op"] for ex in exs} == {"up", "down"}


def test_addsub_answers():
    for ex in cur.examples("addsub", 2000, "train") + cur.examples("addsub", 200, "test"):
        a, op, b = re.fullmatch(r"What is (\d\d) ([+-]) (\d\d)\?", ex["prompt"]).groups()
        c = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert c >= 0 and ex["answer"] == f"{a} {op} {b} = {c}" and ex["final"] == str(c)


@pytest.mark.parametrize("op,items,pos,word,want", [
    ("copy", ["A", "B", "C"], None, None, ["A", "B", "C"]),
    ("reverse", ["A", "B", "C"], None, None, ["C", "B", "A"]),
    ("sort", ["Tom", "Ava", "Max"], None, None, ["Ava", "Max", "Tom"]),
    ("insert", ["A", "B", "C"], 1, "Z", ["Z", "A", "B", "C"]),
    ("insert", ["A", "B", "C"], 4, "Z", ["A", "B", "C", "Z"]),
    ("remove", ["A", "B", "C"], 2, None, ["A", "C"]),
    ("replace", ["A", "B", "C"], 3, "Z", ["A", "B", "Z"]),
])
def test_list_ops(op, items, pos, word, want):
    assert cur.apply_list_op(op, items, pos, word) == want


def test_list_op_bad_position():
    with pytest.raises(ValueError, match="position must be in \\[1, 3\\]"):
        cur.apply_list_op("remove", ["A", "B", "C"], 4)


def test_listops_answers_follow_the_prompt():
    pat = {"insert": r"Insert (\w+) at position (\d) of the list: (.*)\.",
           "remove": r"Remove position (\d) from the list: (.*)\.",
           "replace": r"Replace position (\d) with (\w+) in the list: (.*)\."}
    exs = cur.examples("listops", 1200, "train")
    assert {ex["op"] for ex in exs} == set(cur.LIST_OPS)
    for ex in exs:
        if ex["op"] in pat:
            g = re.fullmatch(pat[ex["op"]], ex["prompt"]).groups()
            if ex["op"] == "insert":
                word, pos, listing = g[0], int(g[1]), g[2]
            elif ex["op"] == "remove":
                word, pos, listing = None, int(g[0]), g[1]
            else:
                pos, word, listing = int(g[0]), g[1], g[2]
        else:
            word, pos, listing = None, None, ex["prompt"].split(": ", 1)[1][:-1]
        items = listing.split(", ")
        assert 3 <= len(items) <= 6 and len(set(items)) == len(items)
        assert ex["answer"].split(", ") == cur.apply_list_op(ex["op"], items, pos, word)


def test_splits_are_disjoint_and_fixed():
    for task in cur.TASKS:
        train = {ex["prompt"] for ex in cur.examples(task, 3000, "train")}
        val = {ex["prompt"] for ex in cur.examples(task, 100, "val")}
        test = cur.examples(task, 100, "test")
        assert not (train & val) and not (train & {e["prompt"] for e in test})
        assert not (val & {e["prompt"] for e in test})
        assert cur.examples(task, 100, "test") == test  # deterministic


def test_build_writes_all_files(tmp_path):
    counts = cur.build(tmp_path, scale=0.001)
    assert counts == {"train.jsonl": 500, "val.jsonl": 3, "test.jsonl": 3}
    assert not list(tmp_path.glob(".*.tmp"))


def test_short_counts_and_the_stop_file(tmp_path):
    short = cur.short_count_examples(300, max_terms=10)
    assert all(ex["task"] == "count" for ex in short)
    lengths = [len(ex["answer"].split(", ")) for ex in short]
    assert all([int(v) for v in ex["answer"].split(", ")] == _count_values(ex["prompt"]) for ex in short)
    demo = [ex for ex in short if ex["prompt"] == "Count from 1 to 200."]
    assert 0 < len(demo) < 30  # the demo range stays in at about 4%
    assert all(3 <= n <= 10 for ex, n in zip(short, lengths) if ex["prompt"] != "Count from 1 to 200.")
    held_out = {ex["prompt"] for split in ("val", "test") for ex in cur.examples("count", 200, split)}
    assert not held_out & {ex["prompt"] for ex in short}
    assert cur.short_count_examples(300, max_terms=10) == short  # deterministic
    with pytest.raises(ValueError, match="max_terms"):
        cur.short_count_examples(1, max_terms=2)
    n = cur.build_stop(tmp_path, 40, 100)
    rows = [json.loads(x) for x in (tmp_path / "stop.jsonl").read_text().splitlines()]
    assert n == len(rows) == 40 + 100  # 12 + 44 + 44 of the usual 60k:220k:220k mix
    assert sum(r["source"] == "count" for r in rows) == 40 + 12


def test_the_stop_stage_file_of_2_to_7_term_ranges(tmp_path):
    short = cur.short_count_examples(400, max_terms=7, min_terms=2, demo=0.0)
    lengths = [len(ex["answer"].split(", ")) for ex in short]
    assert all([int(v) for v in ex["answer"].split(", ")] == _count_values(ex["prompt"]) for ex in short)
    assert set(lengths) == {2, 3, 4, 5, 6, 7}  # every length occurs, nothing outside 2..7
    assert not any(ex["prompt"] == "Count from 1 to 200." for ex in short)  # demo share 0
    assert {ex["op"] for ex in short} == {"up", "down"}
    held_out = {ex["prompt"] for split in ("val", "test") for ex in cur.examples("count", 200, split)}
    assert not held_out & {ex["prompt"] for ex in short}
    for bad, match in (({"min_terms": 1}, "min_terms"), ({"min_terms": 5, "max_terms": 4}, "max_terms")):
        with pytest.raises(ValueError, match=match):
            cur.short_count_examples(1, **bad)
    cur.main(["--out", str(tmp_path), "--stop", "30", "--stop-replay", "20", "--stop-terms", "2-7",
              "--stop-demo", "0"])
    rows = [json.loads(x) for x in (tmp_path / "stop.jsonl").read_text().splitlines()]
    assert len(rows) == 50
    short_rows = [r for r in rows if r["source"] == "count" and len(r["messages"][1]["content"].split(", ")) <= 7]
    assert len(short_rows) >= 30
    with pytest.raises(SystemExit, match="MIN-MAX"):
        cur.main(["--out", str(tmp_path), "--stop", "3", "--stop-terms", "7"])


def test_simple_stop_records_are_short_up_ranges_of_the_train_split(tmp_path):
    exs = cur.simple_count_examples(500, max_terms=6)
    lengths = [len(ex["answer"].split(", ")) for ex in exs]
    assert set(lengths) == {1, 2, 3, 4, 5, 6}
    for ex in exs:
        values = [int(v) for v in ex["answer"].split(", ")]
        assert values == _count_values(ex["prompt"]) and values[-1] <= 999
        assert ex["prompt"].startswith("Count from ") and ex["op"] == "up"
    held_out = {ex["prompt"] for split in ("val", "test") for ex in cur.examples("count", 200, split)}
    assert not held_out & {ex["prompt"] for ex in exs}
    assert cur.simple_count_examples(500, max_terms=6) == exs  # deterministic
    with pytest.raises(ValueError, match="max_terms"):
        cur.simple_count_examples(1, max_terms=0)
    cur.main(["--out", str(tmp_path), "--simple-stop", "25"])
    assert len((tmp_path / "simple_stop.jsonl").read_text().splitlines()) == 25


def test_mix_file_holds_the_requested_records_shuffled_and_train_only(tmp_path):
    out = tmp_path / "mix.jsonl"
    n = cur.build_mix(out, simple={6: 30, 15: 20}, short={20: 10}, replay={"addsub": 5, "listops": 5})
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert n == len(recs) == 70
    by_source = {}
    for r in recs:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    assert by_source == {"count": 60, "addsub": 5, "listops": 5}
    prompts = [r["messages"][0]["content"] for r in recs]
    assert [r["source"] for r in recs[:60]] != ["count"] * 60  # shuffled, not task by task
    counts = [_count_values(p) for p, r in zip(prompts, recs) if r["source"] == "count"]
    assert max(len(v) for v in counts) <= 20 and min(len(v) for v in counts) == 1
    held_out = {ex["prompt"] for split in ("val", "test") for ex in cur.examples("count", 200, split)}
    held_out |= {ex["prompt"] for split in ("val", "test") for t in ("addsub", "listops")
                 for ex in cur.examples(t, 200, split)}
    assert not held_out & set(prompts)
    # the CLI writes the same file from a JSON spec (string keys, seed offset 2 = the default)
    cur.main(["--out", str(tmp_path / "cli.jsonl"), "--mix",
              '{"simple": {"6": 30, "15": 20}, "short": {"20": 10}, "replay": {"addsub": 5, "listops": 5}}'])
    assert (tmp_path / "cli.jsonl").read_text() == out.read_text()
    with pytest.raises(SystemExit, match="unknown keys"):
        cur.main(["--out", str(tmp_path / "bad.jsonl"), "--mix", '{"simpel": {"6": 3}}'])
    with pytest.raises(ValueError, match="unknown task"):
        cur.build_mix(tmp_path / "bad.jsonl", replay={"code": 3})
    assert not (tmp_path / "bad.jsonl").exists()


def test_seed_option_reaches_the_stop_and_mix_files(tmp_path):
    runs = {}
    for seed in ("4242", "5"):
        cur.main(["--out", str(tmp_path / seed), "--simple-stop", "20", "--seed", seed])
        runs[seed] = (tmp_path / seed / "simple_stop.jsonl").read_text()
    default = tmp_path / "default"
    cur.main(["--out", str(default), "--simple-stop", "20"])
    assert (default / "simple_stop.jsonl").read_text() == runs["4242"] != runs["5"]
    cur.main(["--out", str(tmp_path / "a.jsonl"), "--mix", '{"replay": {"addsub": 5}}', "--seed", "5"])
    cur.main(["--out", str(tmp_path / "b.jsonl"), "--mix", '{"replay": {"addsub": 5}}'])
    assert (tmp_path / "a.jsonl").read_text() != (tmp_path / "b.jsonl").read_text()


def test_simple_form_records_cover_down_and_steps_with_few_terms():
    exs = cur.simple_form_examples(400, max_terms=6)
    assert len(exs) == 400 and cur.simple_form_examples(400, max_terms=6) == exs
    steps, downs = set(), 0
    for ex in exs:
        values = [int(v) for v in ex["answer"].split(", ")]
        assert 1 <= len(values) <= 6 and 0 <= min(values) and max(values) <= 1100
        down = ex["prompt"].startswith("Count down from ")
        downs += down
        if len(values) > 1:
            step = abs(values[1] - values[0])
            steps.add(step)
            assert values == list(range(values[0], values[-1] + (-step if down else step), -step if down else step))
        low, high = min(values), max(values)
        step = abs(values[1] - values[0]) if len(values) > 1 else None
        if step is not None:  # the split key of a one-term range does not name its step
            assert cur.split_of(f"count:{low}:{high}:{step}" + (":down" if down else "")) == "train"
    assert steps == {1, 2, 5, 10} and 150 < downs < 250
    with pytest.raises(ValueError, match="max_terms"):
        cur.simple_form_examples(1, max_terms=0)


def test_mix_spec_takes_simple_forms(tmp_path):
    cur.main(["--out", str(tmp_path / "m.jsonl"), "--mix", '{"simple_forms": {"6": 40}, "replay": {"addsub": 3}}'])
    recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(recs) == 43 and sum(r["source"] == "count" for r in recs) == 40
    assert any(r["messages"][0]["content"].startswith("Count down") for r in recs)


@pytest.mark.parametrize("digits, n, max_extra, periods", [
    (1, 300, 30, {1: 10, 2: 5, 5: 2, 10: 1}),
    (2, 200, 50, {1: 100, 2: 50, 5: 20, 10: 10}),
])
def test_distractor_records_hold_an_earlier_value_with_the_end_digits(digits, n, max_extra, periods):
    """Every record holds an earlier value ending in the end value's last `digits` digits (where
    the shortcut would stop), with period + 1 .. period + max_extra terms, at most 150."""
    exs = cur.distractor_count_examples(n, max_extra=max_extra, digits=digits)
    assert len(exs) == n and cur.distractor_count_examples(n, max_extra=max_extra, digits=digits) == exs
    assert exs != cur.distractor_count_examples(n, max_extra=max_extra, digits=3 - digits)  # own draws
    steps = set()
    for ex in exs:
        values = [int(v) for v in ex["answer"].split(", ")]
        step = abs(values[1] - values[0])
        steps.add(step)
        period = periods[step]
        assert period + 1 <= len(values) <= min(period + max_extra, 150)
        assert 0 <= min(values) and max(values) <= 1100
        assert any(v % 10 ** digits == values[-1] % 10 ** digits for v in values[:-1])
        down = ex["prompt"].startswith("Count down from ")
        key = f"count:{min(values)}:{max(values)}:{step}" + (":down" if down else "")
        assert cur.split_of(key) == "train"
    assert steps == {1, 2, 5, 10}


def test_distractor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_extra"):
        cur.distractor_count_examples(1, max_extra=0)
    with pytest.raises(ValueError, match="digits"):
        cur.distractor_count_examples(1, digits=3)


def test_mix_spec_takes_two_digit_distractor(tmp_path):
    cur.main(["--out", str(tmp_path / "m.jsonl"), "--mix", '{"distractor2": {"50": 12}, "replay": {"addsub": 2}}'])
    recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(recs) == 14 and sum(r["source"] == "count" for r in recs) == 12
    assert min(len(r["messages"][1]["content"].split(", ")) for r in recs if r["source"] == "count") >= 11


def test_tens_records_count_up_in_steps_of_ten_within_range():
    exs = cur.tens_count_examples(300, "t", max_terms=12)
    assert len(exs) == 300 and cur.tens_count_examples(300, "t", max_terms=12) == exs
    assert cur.tens_count_examples(300, "u", max_terms=12) != exs
    lengths = set()
    for ex in exs:
        values = [int(v) for v in ex["answer"].split(", ")]
        assert ex["prompt"] == f"Count from {values[0]} to {values[-1]} in steps of 10."
        assert values == list(range(values[0], values[-1] + 1, 10)) and max(values) <= 1100
        lengths.add(len(values))
        assert cur.split_of(f"count:{values[0]}:{values[-1]}:10") == "train"
    assert lengths == set(range(2, 13))
    with pytest.raises(ValueError, match="max_terms"):
        cur.tens_count_examples(1, max_terms=1)


def test_mix_spec_takes_distractor(tmp_path):
    cur.main(["--out", str(tmp_path / "m.jsonl"), "--mix", '{"distractor": {"30": 25}, "replay": {"listops": 2}}'])
    recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(recs) == 27 and sum(r["source"] == "count" for r in recs) == 25
    with pytest.raises(SystemExit, match="distractor"):
        cur.main(["--out", str(tmp_path / "x.jsonl"), "--mix", '{"distracter": {"30": 1}}'])


@pytest.mark.parametrize("width", [1, 20, 21])
def test_carry_records_sit_next_to_a_change_of_digit_count(width):
    """Sums fall in 100 - width .. 99 + width, differences in 10 - h .. 9 + h (h = max(1, width // 2));
    both operands stay two-digit, the answer is right, and every prompt is of the train split."""
    exs = cur.carry_addsub_examples(400, width=width)
    assert len(exs) == 400 and cur.carry_addsub_examples(400, width=width) == exs
    ops = {"add": 0, "sub": 0}
    for ex in exs:
        a, op, b = ex["prompt"][len("What is "):-1].split()
        a, b, c = int(a), int(b), int(ex["final"])
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert c == (a + b if op == "+" else a - b) and ex["answer"] == f"{a} {op} {b} = {c}"
        lo, hi = (100 - width, 99 + width) if op == "+" else (10 - max(1, width // 2), 9 + max(1, width // 2))
        assert lo <= c <= hi
        assert cur.split_of(ex["prompt"]) == "train" and ex["task"] == "addsub"
        ops[ex["op"]] += 1
    assert 0.65 < ops["add"] / 400 < 0.85  # three quarters sums
    for bad in (0, 22):
        with pytest.raises(ValueError, match="width"):
            cur.carry_addsub_examples(1, width=bad)


def test_mix_spec_takes_carry(tmp_path):
    cur.main(["--out", str(tmp_path / "m.jsonl"), "--mix", '{"carry": {"20": 30}, "replay": {"count": 2}}'])
    recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(recs) == 32 and sum(r["source"] == "addsub" for r in recs) == 30
    finals = [int(r["messages"][1]["content"].split(" = ")[1]) for r in recs if r["source"] == "addsub"]
    assert all(80 <= f <= 119 or 0 <= f <= 19 for f in finals)


def test_edge_records_start_near_zero_or_end_near_a_change_of_digit_count():
    """Every range starts within three steps of 0, says its last value within three steps of
    10/100/1000, or reaches 1000..1100; 2..max_terms terms; all forms; every key of the train split."""
    exs = cur.edge_count_examples(600, max_terms=40)
    assert len(exs) == 600 and cur.edge_count_examples(600, max_terms=40) == exs
    assert cur.edge_count_examples(600, max_terms=20) != exs  # own draws per max_terms
    kinds = {"zero": 0, "crossing": 0, "four": 0}
    steps, downs = set(), 0
    for ex in exs:
        values = [int(v) for v in ex["answer"].split(", ")]
        assert values == _count_values(ex["prompt"])
        assert 2 <= len(values) <= 40 and 0 <= min(values) and max(values) <= 1100
        step = abs(values[1] - values[0])
        steps.add(step)
        down = ex["prompt"].startswith("Count down from ")
        downs += down
        key = f"count:{min(values)}:{max(values)}:{step}" + (":down" if down else "")
        assert cur.split_of(key) == "train"
        zero = min(values) <= 3 * step
        crossing = any(abs(values[-1] - c) <= 3 * step for c in (10, 100, 1000))
        four = 1000 <= max(values) <= 1100
        assert zero or crossing or four, ex["prompt"]
        kinds["zero"] += zero
        kinds["crossing"] += crossing
        kinds["four"] += four
    assert steps == {1, 2, 5, 10} and 0.35 < downs / 600 < 0.65
    assert kinds["zero"] > 150 and kinds["crossing"] > 200 and kinds["four"] > 100
    with pytest.raises(ValueError, match="max_terms"):
        cur.edge_count_examples(1, max_terms=1)


def test_mix_spec_takes_edge(tmp_path):
    cur.main(["--out", str(tmp_path / "m.jsonl"), "--mix", '{"edge": {"12": 20}, "replay": {"addsub": 3}}'])
    recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(recs) == 23 and sum(r["source"] == "count" for r in recs) == 20
    assert max(len(r["messages"][1]["content"].split(", ")) for r in recs if r["source"] == "count") <= 12


def test_the_demo_prompt_is_train_by_the_hash_rule_alone():
    from wedlm.data.synthetic import stable_hash

    assert not hasattr(cur, "PINNED_TRAIN")
    assert stable_hash("count:1:200:1") % cur.BUCKETS == 13 and cur.split_of("count:1:200:1") == "train"


def test_from_one_heldout_lists_the_test_and_validation_ends():
    test, val = cur.from_one_heldout("test"), cur.from_one_heldout("val")

    def ends(exs):
        return [int(ex["prompt"][len("Count from 1 to "):-1]) for ex in exs]

    assert ends(test) == [21, 22, 48, 75, 79, 88, 142, 157, 212, 224, 233, 238, 292]
    assert len(val) == 20 and not set(ends(test)) & set(ends(val)) and 200 not in ends(test) + ends(val)
    assert all(ex["answer"] == ", ".join(str(v) for v in range(1, n + 1)) for ex, n in zip(test, ends(test)))
    with pytest.raises(ValueError, match="split"):
        cur.from_one_heldout("train")


def test_small_start_records_read_any_end_and_skip_the_held_out_ones():
    exs = cur.from_small_examples(3000, max_end=320, max_start=10)
    held = {ex["prompt"] for ex in cur.from_one_heldout("test") + cur.from_one_heldout("val")}
    assert len(exs) == 3000 and cur.from_small_examples(3000, max_end=320, max_start=10) == exs
    starts, ends = [], []
    for ex in exs:
        values = _count_values(ex["prompt"])
        assert ex["answer"] == ", ".join(map(str, values)) and ex["prompt"] not in held
        starts.append(values[0])
        ends.append(values[-1])
        assert 0 <= values[0] <= 10 and values[0] < values[-1] <= 320
    assert 0.55 < starts.count(1) / len(exs) < 0.7  # a share `one` of starts at 1, the rest 0..10
    assert sum(e > 200 for e in ends) > 0.25 * len(exs)
    assert starts.count(1) > 0 and ends.count(200) < 0.01 * len(exs)  # the demo range: natural rate only
    with pytest.raises(ValueError, match="max_start"):
        cur.from_small_examples(1, max_end=5, max_start=5)


def test_mix_spec_takes_from_small_and_the_replay_demo_share(tmp_path):
    spec = '{"from_small": {"50": 30}, "replay": {"count": 400}, "replay_demo": %s}'
    for share, expect_demo in (("0.0", False), ("0.04", True)):
        cur.main(["--out", str(tmp_path / "m.jsonl"), "--mix", spec % share])
        recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
        assert len(recs) == 430
        small = [r for r in recs if r["messages"][0]["content"].startswith("Count from ")
                 and _count_values(r["messages"][0]["content"])[-1] <= 50 and r["messages"][1]["content"][:2] in
                 {f"{a}," for a in range(10)}]
        assert len(small) >= 30
        assert any(r["messages"][0]["content"] == "Count from 1 to 200." for r in recs) == expect_demo


def test_tens_option_writes_the_steps_of_ten_file(tmp_path):
    cur.main(["--out", str(tmp_path / "t.jsonl"), "--tens", "20"])
    recs = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in recs] == [
        ex["prompt"] for ex in cur.tens_count_examples(20, "probe-step10-long")]
