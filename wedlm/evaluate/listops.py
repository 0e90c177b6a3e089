"""List-operation tasks: where parallel decoding loses what AR decoding gets for free.

What: the `listops` family of `wedlm eval`. ParallelBench (arXiv 2510.04767)
shows that diffusion decoders that commit several tokens per step fail on
simple operations over short lists of names (copy, reverse, sort, shuffle,
insert / remove / replace at an index or at random) that are trivial for AR
decoding, because the tokens committed together are not independent. This
module holds

* `parse_list`: a generation -> list of items (a bracketed JSON-style list, or
  comma-separated items on the first line);
* the scorers: exact list match for deterministic operations and validity for
  the random ones (`valid_shuffle`, `valid_random_insert`,
  `valid_random_remove`, `valid_random_replace`), dispatched on the item's
  reference by `score_list_item`;
* `listops_tasks`: held-out items of our own generator
  (`wedlm.data.curriculum`, "test" split: never trained on), one task per
  operation;
* `listops_table`: the per-operation summary (AR accuracy, WeDLM accuracy and
  tokens per forward, verified accuracy, which must equal AR's).

Files in ParallelBench's layout are read by `wedlm.evaluate.parallelbench`.
"""

from __future__ import annotations

import json

from wedlm.data import curriculum

from .tasks import EvalItem, EvalTask, Score, chat_item

SCORE_KINDS = ("exact", "shuffle", "insert", "remove", "replace")
MAX_TOKENS = 64  # our lists: at most 7 one-token names with ", " between them


def parse_list(text: str) -> list[str] | None:
    """The list a generation states, or None when it states none.

    The last `[...]` in the text is read as a JSON list (else split on commas, quotes
    stripped); without brackets, the first non-empty line is split on commas and a
    final period dropped. Items are stripped of spaces.
    """
    if "[" in text:
        body = text[text.rindex("["):]
        end = body.find("]")
        if end < 0:
            return None
        body = body[:end + 1]
        try:
            items = json.loads(body)
            if isinstance(items, list):
                return [str(x).strip() for x in items]
        except json.JSONDecodeError:
            pass
        return [p.strip().strip('"\'').strip() for p in body[1:-1].split(",") if p.strip()]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return None
    line = line[:-1] if line.endswith(".") else line
    return [p.strip() for p in line.split(",") if p.strip()]


def valid_shuffle(pred: list[str], original: list[str]) -> bool:
    """Same items (with multiplicity) in a different order; an unchanged copy is not a shuffle."""
    return sorted(pred) == sorted(original) and pred != original


def valid_random_insert(pred: list[str], original: list[str], word: str) -> bool:
    """`word` added once at some position, every other item kept in order."""
    return len(pred) == len(original) + 1 and any(
        p == word and pred[:i] + pred[i + 1:] == original for i, p in enumerate(pred))


def valid_random_remove(pred: list[str], original: list[str]) -> bool:
    """Exactly one item gone, the others kept in order."""
    return len(pred) == len(original) - 1 and any(
        original[:i] + original[i + 1:] == pred for i in range(len(original)))


def valid_random_replace(pred: list[str], original: list[str], word: str | None) -> bool:
    """Exactly one position changed (to `word` when given), every other position equal."""
    if len(pred) != len(original):
        return False
    changed = [i for i, (p, o) in enumerate(zip(pred, original)) if p != o]
    return len(changed) == 1 and (word is None or pred[changed[0]] == word)


def list_reference(kind: str, gold: list[str] | None = None, original: list[str] | None = None,
                   word: str | None = None) -> dict:
    """An item reference for `score_list_item`.

    Raises:
        ValueError: an unknown `kind`, or the list that `kind` needs is missing.
    """
    if kind not in SCORE_KINDS:
        raise ValueError(f"score kind must be one of {SCORE_KINDS}, got {kind!r}")
    if kind == "exact" and gold is None:
        raise ValueError("an exact-match list item needs its gold list")
    if kind != "exact" and original is None:
        raise ValueError(f"a random {kind} item needs the original list")
    if kind == "insert" and word is None:
        raise ValueError("a random insert item needs the inserted word")
    return {"kind": kind, "gold": gold, "original": original, "word": word}


def same_list(text: str, answer: str) -> bool:
    """True when `text` states the same list as `answer` (both read by `parse_list`).

    The one rule by which every list-operation answer is scored: `wedlm eval`, `wedlm bench`
    and the curriculum suite of the tiny model's recipes.
    """
    return _same_parsed(parse_list(text), answer)


def _same_parsed(pred: list[str] | None, answer: str) -> bool:
    return pred is not None and pred == parse_list(answer)


def score_list_answer(item: EvalItem, text: str) -> Score:
    """`same_list` of the generation and the item's reference answer text (a str)."""
    pred = parse_list(text)  # read once: the verdict and the recorded prediction
    return Score(correct=_same_parsed(pred, item.reference), predicted=None if pred is None else json.dumps(pred))


def score_list_item(item: EvalItem, text: str) -> Score:
    """Exact match (`kind` "exact") or validity (the random kinds) of the list in `text`."""
    ref = item.reference
    pred = parse_list(text)
    if pred is None:
        return Score(correct=False, predicted=None, detail="no list found")
    kind = ref["kind"]
    if kind == "exact":
        ok = pred == ref["gold"]
    elif kind == "shuffle":
        ok = valid_shuffle(pred, ref["original"])
    elif kind == "insert":
        ok = valid_random_insert(pred, ref["original"], ref["word"])
    elif kind == "remove":
        ok = valid_random_remove(pred, ref["original"])
    else:
        ok = valid_random_replace(pred, ref["original"], ref["word"])
    return Score(correct=ok, predicted=json.dumps(pred))


def listops_items(op: str, n: int) -> list[EvalItem]:
    """The first `n` held-out ("test" split) items of list operation `op` from our generator.

    Raises:
        ValueError: an unknown operation, or `n` < 1.
    """
    if op not in curriculum.LIST_OPS:
        raise ValueError(f"list operation must be one of {curriculum.LIST_OPS}, got {op!r}")
    if n < 1:
        raise ValueError(f"items per operation must be >= 1, got {n}")
    want = n * len(curriculum.LIST_OPS) * 2
    while True:  # the generator draws operations at random; ask for more until `op` has n
        chosen = [ex for ex in curriculum.examples("listops", want, "test") if ex["op"] == op][:n]
        if len(chosen) == n:
            break
        want *= 2
    return [chat_item(f"listops/{op}/{i}", ex["prompt"],
                      list_reference("exact", gold=[s.strip() for s in ex["answer"].split(",")]))
            for i, ex in enumerate(chosen)]


def listops_tasks(n: int = 50, max_tokens: int | None = None) -> list[EvalTask]:
    """One task per list operation (`listops/copy`, `listops/reverse`, ...), `n` held-out items each."""
    return [EvalTask(name=f"listops/{op}", items=listops_items(op, n), score=score_list_item,
                     max_tokens=max_tokens or MAX_TOKENS, kind="low-entropy")
            for op in curriculum.LIST_OPS]


def is_listops(task_name: str) -> bool:
    """Whether a report row belongs to the list-operation family."""
    return task_name.startswith("listops/")


def listops_table(reports: list[dict]) -> list[dict]:
    """Per-operation rows from `evaluate` reports (one per task and decoder).

    Returns:
        one dict per listops task, in first-seen order: {task, n, ar, wedlm,
        wedlm_tokens_per_forward, verified, verified_equals_ar}; an accuracy is None
        when that decoder did not run; `verified_equals_ar` is None unless both ran,
        then True when their accuracies are equal and, where both reports keep every
        item's output (`samples`), the outputs are identical item by item.
    """
    rows: dict[str, dict] = {}
    outputs: dict[tuple[str, str], list | None] = {}
    for r in reports:
        if not is_listops(r["task"]):
            continue
        row = rows.setdefault(r["task"], {"task": r["task"], "n": r["n"], "ar": None, "wedlm": None,
                                          "wedlm_tokens_per_forward": None, "verified": None,
                                          "verified_equals_ar": None})
        decoding = r["decode"]["decoding"]
        kept = r.get("samples") or []
        outputs[r["task"], decoding] = [s["output"] for s in kept] if len(kept) == r["n"] else None
        if decoding in ("ar", "wedlm", "verified"):
            row[decoding] = r["accuracy"]
        if decoding == "wedlm":
            row["wedlm_tokens_per_forward"] = r["metrics"]["tokens_per_forward"]
    for task, row in rows.items():
        if row["ar"] is not None and row["verified"] is not None:
            ar, verified = outputs.get((task, "ar")), outputs.get((task, "verified"))
            same_outputs = ar is None or verified is None or ar == verified
            row["verified_equals_ar"] = row["ar"] == row["verified"] and same_outputs
    return list(rows.values())


def render_listops_table(rows: list[dict]):
    """A rich Table of `listops_table` rows (accuracies in %, '-' where a decoder did not run)."""
    from rich.table import Table

    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}%"

    table = Table(title="listops: per operation")
    for col in ("task", "n", "AR", "WeDLM", "WeDLM tok/fwd", "verified", "verified = AR"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for row in rows:
        tpf = row["wedlm_tokens_per_forward"]
        same = {None: "-", True: "yes", False: "NO"}[row["verified_equals_ar"]]
        table.add_row(row["task"], str(row["n"]), pct(row["ar"]), pct(row["wedlm"]),
                      "-" if tpf is None else f"{tpf:.2f}", pct(row["verified"]), same)
    return table
