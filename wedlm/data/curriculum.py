"""The tiny model's curriculum: counting, two-digit addition/subtraction and list operations.

What: three task families a few-million-parameter model can learn in about two
CPU hours, each example a ``{"task", "op", "prompt", "answer", "final"}`` dict:

* ``count``: "Count from A to B." / "Count down from B to A." with steps 1, 2, 5
  or 10, 3 to 150 terms, starts 0..999; a third of the ranges are drawn to cross
  a digit-length change (9 -> 10, 99 -> 100, 999 -> 1000), where parallel fills
  go wrong first. The answer is the comma-separated listing.
* ``addsub``: "What is A + B?" / "What is A - B?" with two-digit A, B (A >= B for
  subtraction); the answer is one line "A + B = C" that ends in the number.
* ``listops``: copy, reverse, sort, insert / remove / replace at a 1-based
  position, on 3-6 distinct short names (every name is one token of the shipped
  tokenizer); the answer is the resulting comma-separated list. This is the task
  family of ParallelBench (arXiv 2510.04767), with our own names and wording.

Split rule: every example has a key (the range for ``count``, the prompt
otherwise). Keys whose stable hash (``synthetic.stable_hash``) falls in bucket 0
of 20 are the TEST split, bucket 1 the VALIDATION split (for tuning decoding
knobs), all others TRAIN. A generator never yields a key of another split, so
the splits are disjoint by construction. The demo prompt "Count from 1 to 200." falls in TRAIN by
this rule (its key's bucket is 13), so it is itself a training prompt; `from_one_heldout` lists the
"Count from 1 to N." prompts that the rule holds out.

``python -m wedlm.data.curriculum --out data/curriculum`` writes ``train.jsonl``
(chat records ``{"messages", "source"}``), ``val.jsonl`` and ``test.jsonl``
(example dicts) atomically; ``--stop N`` writes only ``stop.jsonl``: N short counting
records (3-10 terms, many stop decisions per token) and N records of the usual mix.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

from .synthetic import stable_hash

BUCKETS = 20
SPLIT_BUCKET = {"test": 0, "val": 1}
SPLITS = ("train", "val", "test")
SEEDS = {"train": 4242, "val": 77, "test": 999_999}

NAMES = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Emma",
         "Jack", "Ivy", "Noah", "Ava", "Eli", "Ruby"]
LIST_OPS = ("copy", "reverse", "sort", "insert", "remove", "replace")
STEPS = (1, 1, 1, 1, 2, 5, 10)
CROSSINGS = (10, 100, 1000)  # first value of a new digit length

Example = dict


def split_of(key: str) -> str:
    """"train", "val" or "test" for an example key (see the module docstring)."""
    bucket = stable_hash(key) % BUCKETS
    for name, b in SPLIT_BUCKET.items():
        if bucket == b:
            return name
    return "train"


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


# ------------------------------------------------------------------- count ---

def count_range(rng: random.Random, max_terms: int = 150, min_terms: int = 3,
                demo: float = 0.04) -> tuple[int, int, int]:
    """(low, high, step): values low, low+step, ..., high with `min_terms`..`max_terms` terms
    (half of the ranges at most 30), 0 <= low, high <= 1100; a share `demo` are the demo
    range 1..200."""
    if rng.random() < demo:
        return 1, 200, 1
    step = rng.choice(STEPS)
    terms = rng.randint(min_terms, min(30, max_terms)) if rng.random() < 0.5 else rng.randint(min_terms, max_terms)
    terms = min(terms, 1100 // step + 1)
    if rng.random() < 0.35:  # cross a digit-length change inside the range
        low = max(0, rng.choice(CROSSINGS) - rng.randint(1, terms - 1) * step)
    else:
        low = rng.randint(0, 999)
        if step > 1 and rng.random() < 0.7:
            low -= low % step
    high = low + (terms - 1) * step
    if high > 1100:
        low, high = low - (high - 1100), 1100
    return low, high, step


def count_example(low: int, high: int, step: int = 1, down: bool = False) -> tuple[Example, str]:
    """The counting example of one range and its split key ("count:low:high:step[:down]")."""
    values = list(range(low, high + 1, step))
    suffix = "" if step == 1 else f" in steps of {step}"
    if down:
        values.reverse()
        prompt = f"Count down from {high} to {low}{suffix}."
    else:
        prompt = f"Count from {low} to {high}{suffix}."
    return ({"task": "count", "op": "down" if down else "up", "prompt": prompt, "answer": _join(values),
             "final": None}, f"count:{low}:{high}:{step}" + (":down" if down else ""))


def gen_count(rng: random.Random, max_terms: int = 150, min_terms: int = 3,
              demo: float = 0.04) -> tuple[Example, str]:
    """Counting up or down from a random range (see `count_range`); the answer is the full listing."""
    low, high, step = count_range(rng, max_terms, min_terms, demo)
    down = (low, high, step) != (1, 200, 1) and rng.random() < 0.3  # the demo range only counts up
    return count_example(low, high, step, down)


# ------------------------------------------------------------------ addsub ---

def addsub_example(a: int, op: str, b: int) -> tuple[Example, str]:
    """The example "What is A op B?" -> "A op B = C" (op "+" or "-") and its key (the prompt)."""
    c = a + b if op == "+" else a - b
    prompt = f"What is {a} {op} {b}?"
    return ({"task": "addsub", "op": "add" if op == "+" else "sub", "prompt": prompt,
             "answer": f"{a} {op} {b} = {c}", "final": str(c)}, prompt)


def gen_addsub(rng: random.Random) -> tuple[Example, str]:
    """Two-digit addition or subtraction (non-negative result); answer "A op B = C"."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return addsub_example(a, "+", b)
    return addsub_example(max(a, b), "-", min(a, b))


# ----------------------------------------------------------------- listops ---

def apply_list_op(op: str, items: list[str], position: int | None = None, word: str | None = None) -> list[str]:
    """The list after `op` (1-based `position` for insert/remove/replace).

    Raises:
        ValueError: an unknown op or a position outside the list.
    """
    if op == "copy":
        return list(items)
    if op == "reverse":
        return items[::-1]
    if op == "sort":
        return sorted(items)
    limit = len(items) + 1 if op == "insert" else len(items)
    if position is None or not 1 <= position <= limit:
        raise ValueError(f"position must be in [1, {limit}] for {op}, got {position}")
    out = list(items)
    if op == "insert":
        out.insert(position - 1, word)
    elif op == "remove":
        del out[position - 1]
    elif op == "replace":
        out[position - 1] = word
    else:
        raise ValueError(f"unknown list op {op!r}; expected one of {LIST_OPS}")
    return out


def gen_listops(rng: random.Random, op: str | None = None) -> tuple[Example, str]:
    """One list operation on 3-6 distinct names; answer is the resulting list."""
    op = op or rng.choice(LIST_OPS)
    names = rng.sample(NAMES, rng.randint(3, 6) + 1)
    items, word = names[:-1], names[-1]
    listing = _join(items)
    position = None
    if op == "copy":
        prompt = f"Repeat the list: {listing}."
    elif op == "reverse":
        prompt = f"Reverse the list: {listing}."
    elif op == "sort":
        prompt = f"Sort the list: {listing}."
    elif op == "insert":
        position = rng.randint(1, len(items) + 1)
        prompt = f"Insert {word} at position {position} of the list: {listing}."
    elif op == "remove":
        position = rng.randint(1, len(items))
        prompt = f"Remove position {position} from the list: {listing}."
    else:
        position = rng.randint(1, len(items))
        prompt = f"Replace position {position} with {word} in the list: {listing}."
    answer = _join(apply_list_op(op, items, position, word))
    return {"task": "listops", "op": op, "prompt": prompt, "answer": answer, "final": None}, prompt


GENERATORS: dict[str, Callable[[random.Random], tuple[Example, str]]] = {
    "count": gen_count, "addsub": gen_addsub, "listops": gen_listops,
}
TASKS = tuple(GENERATORS)


def draw_split(n: int, draw, split: str = "train") -> list[Example]:
    """The first `n` examples of `split` among successive `draw()` results ((example, key) pairs);
    drawn examples of other splits are skipped, so the result never leaks across splits."""
    out: list[Example] = []
    while len(out) < n:
        ex, key = draw()
        if split_of(key) == split:
            out.append(ex)
    return out


def examples(task: str, n: int, split: str, seed: int | None = None, demo: float = 0.04) -> list[Example]:
    """`n` examples of `task` from `split`, deterministic in (task, split, seed); `demo` is the
    share of counting draws that are the demo range 1..200 (`count_range`; the evaluation splits
    and the earlier stages' data keep 0.04, the default).

    Raises:
        ValueError: unknown task or split.
    """
    if task not in GENERATORS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"{task}:{split}:{SEEDS[split] if seed is None else seed}")
    if task == "count":
        return draw_split(n, lambda: gen_count(rng, demo=demo), split)
    return draw_split(n, lambda: GENERATORS[task](rng), split)


def to_chat(ex: Example) -> dict:
    """Chat SFT record of one example: user prompt, assistant answer."""
    return {"messages": [{"role": "user", "content": ex["prompt"]},
                         {"role": "assistant", "content": ex["answer"]}], "source": ex["task"]}


# Train records per task: counting answers are ~20x longer than the others, so this mix is
# roughly half counting, a quarter each arithmetic and list operations by answer tokens.
TRAIN_RECORDS = {"count": 60_000, "addsub": 220_000, "listops": 220_000}
EVAL_RECORDS = {"count": 200, "addsub": 200, "listops": 300}


def write_jsonl(path: Path, records) -> int:
    """Write one JSON object per line via a temp file and rename (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
            n += 1
    tmp.replace(path)
    return n


def train_chat_records(counts: dict[str, int], seed: int, demo: float = 0.04) -> list[dict]:
    """Chat records of `counts[task]` TRAIN-split examples per task (seed `seed`, demo share
    `demo` among counting draws), task by task."""
    return [to_chat(ex) for task, n in counts.items() for ex in examples(task, n, "train", seed, demo)]


def build(out: Path, scale: float = 1.0, seed: int = SEEDS["train"]) -> dict:
    """Write train.jsonl (shuffled chat records), val.jsonl and test.jsonl; returns counts."""
    rng = random.Random(f"curriculum:{seed}")
    train = train_chat_records({task: max(1, int(n * scale)) for task, n in TRAIN_RECORDS.items()}, seed)
    rng.shuffle(train)
    counts = {"train.jsonl": write_jsonl(out / "train.jsonl", train)}
    for split in ("val", "test"):
        recs = [ex for task, n in EVAL_RECORDS.items() for ex in examples(task, max(1, int(n * scale)), split)]
        counts[f"{split}.jsonl"] = write_jsonl(out / f"{split}.jsonl", recs)
    return counts


def short_count_examples(n: int, seed: int = SEEDS["train"], max_terms: int = 10,
                         min_terms: int = 3, demo: float = 0.04) -> list[Example]:
    """`n` TRAIN-split counting examples of `min_terms`..`max_terms` terms (plus the demo range
    1..200 at a share `demo`).

    Each counting record holds exactly one decision to stop at the end value read from the
    prompt; short ranges put many of those decisions in few tokens (the shipped model counts
    right but stops late). Keys follow the split rule, so no test or validation range appears.

    Raises:
        ValueError: `min_terms` < 2 or `max_terms` < `min_terms`.
    """
    if min_terms < 2:
        raise ValueError(f"min_terms must be >= 2, got {min_terms}")
    if max_terms < min_terms:
        raise ValueError(f"max_terms must be >= min_terms ({min_terms}), got {max_terms}")
    # the default settings keep the seed string of the first stop file, so it is rebuilt identically
    name = f"count-short:{seed}:{max_terms}" + ("" if (min_terms, demo) == (3, 0.04) else f":{min_terms}:{demo}")
    rng = random.Random(name)
    return draw_split(n, lambda: gen_count(rng, max_terms, min_terms, demo))


def simple_count_examples(n: int, seed: int = SEEDS["train"], max_terms: int = 6) -> list[Example]:
    """`n` TRAIN-split "Count from A to B." examples of 1..`max_terms` terms, up, step 1, A+terms-1
    <= 999: the simplest data with a stop decision every few numbers.

    On such data a 4-layer model learns to read B from the prompt in a few hundred steps (the
    end token's probability right after B jumps to ~1), which mixed counting forms and longer
    ranges did not teach (docs/training.md, "Stopping at the end value").

    Raises:
        ValueError: `max_terms` < 1.
    """
    if max_terms < 1:
        raise ValueError(f"max_terms must be >= 1, got {max_terms}")
    rng = random.Random(f"count-simple:{seed}:{max_terms}")

    def draw() -> tuple[Example, str]:
        terms = rng.randint(1, max_terms)
        low = rng.randint(0, 1000 - terms)
        return count_example(low, low + terms - 1)

    return draw_split(n, draw)


def _any_form_example(rng: random.Random, step: int, terms: int) -> tuple[Example, str]:
    """A `terms`-term range of `step` within 0..1100 (its start a multiple of `step` 70% of the
    time when step > 1), counted up or down (half each)."""
    low = rng.randint(0, 1100 - (terms - 1) * step)
    if step > 1 and rng.random() < 0.7:
        low -= low % step
    return count_example(low, low + (terms - 1) * step, step, down=rng.random() < 0.5)


def _form_examples(n: int, seed_name: str, terms: Callable[[random.Random, int], int]) -> list[Example]:
    """`n` TRAIN-split examples of every form: per draw a step of 1/2/5/10 (a quarter each), then
    `terms(rng, step)` terms, then `_any_form_example`; `seed_name` seeds the draws."""
    rng = random.Random(seed_name)

    def draw() -> tuple[Example, str]:
        step = rng.choice((1, 2, 5, 10))
        return _any_form_example(rng, step, terms(rng, step))

    return draw_split(n, draw)


def simple_form_examples(n: int, seed: int = SEEDS["train"], max_terms: int = 6) -> list[Example]:
    """`n` TRAIN-split 1..`max_terms`-term counting examples of every form: up or down (half
    each), step 1, 2, 5 or 10 (a quarter each), within 0..1100.

    The counterpart of `simple_count_examples` (up, step 1 only) for the forms a model that
    reads B on simple up ranges still fails: "Count down from B to A." must stop at A, and a
    stepped range at the last multiple. A stop decision every few numbers, as there.

    Raises:
        ValueError: `max_terms` < 1.
    """
    if max_terms < 1:
        raise ValueError(f"max_terms must be >= 1, got {max_terms}")
    return _form_examples(n, f"count-simple-forms:{seed}:{max_terms}", lambda rng, step: rng.randint(1, max_terms))


def distractor_count_examples(n: int, seed: int = SEEDS["train"], max_extra: int = 30,
                              digits: int = 1) -> list[Example]:
    """`n` TRAIN-split counting examples of every form (up or down, steps 1/2/5/10) in which an
    earlier value already ends in the end value's last `digits` digits (1 or 2).

    The last digit of a range repeats every `p` = 10 / gcd(step, 10) terms (10 for step 1, 5 for
    step 2, 2 for step 5, 1 for step 10), so a range of `p` + 1 .. `p` + `max_extra` terms holds at
    least one value before the end that a "stop when the last digit matches" rule would stop at.
    That shortcut is what 1-6-term ranges teach (there it is always right): a model trained on
    them stopped at the first value whose last digit equals B's in 47 of 60 validation ranges of
    8-40 terms (docs/training.md, "The last-digit shortcut"). Here only all digits decide.

    With `digits` = 2 the same holds for B's last two digits, which repeat every
    `p` = 100 / gcd(step, 100) terms (100 for step 1, 50 for step 2, 20 for step 5, 10 for step 10):
    a model trained on ranges shorter than that stopped at the first value ending in B's last two
    digits ("Count from 483 to 625." ended at 525) in 17 of 60 validation ranges of 31-150 terms
    (docs/experiments.md, "The last-two-digits shortcut"). Ranges stay within 150 terms (the
    evaluation's longest) and 0..1100.

    Raises:
        ValueError: `max_extra` < 1, or `digits` not 1 or 2.
    """
    if max_extra < 1:
        raise ValueError(f"max_extra must be >= 1, got {max_extra}")
    if digits not in (1, 2):
        raise ValueError(f"digits must be 1 or 2, got {digits}")

    def terms(rng: random.Random, step: int) -> int:
        period = 10 ** digits // math.gcd(step, 10 ** digits)
        return rng.randint(period + 1, min(period + max_extra, 150, 1100 // step + 1))

    name = f"count-distractor:{seed}:{max_extra}" + ("" if digits == 1 else f":{digits}")
    return _form_examples(n, name, terms)


def edge_count_examples(n: int, seed: int = SEEDS["train"], max_terms: int = 40) -> list[Example]:
    """`n` TRAIN-split counting examples of every form (up or down, steps 1/2/5/10) whose range
    starts near 0 or ends within three steps of a change in the number of digits (10, 100,
    1000), or runs from below 1000 to 1000..1100; 2..`max_terms` terms.

    Why: these endpoints are where streaming decoding lost items that AR decoding got right on
    validation ("Count from 0 to 14 in steps of 2." -> "2, 4, 4, 8"; "Count from 0 to 10." ran
    on to 13; "Count down from 101 to 98." stopped at 99; "Count from 977 to 1100." stopped at
    1000): near a length change, a far slot's mask must know how many digits the values have
    and when the last one comes without seeing the values before it. The usual generator puts
    a length change inside a range (35%) but rarely within a few steps of either end.

    Raises:
        ValueError: `max_terms` < 2.
    """
    if max_terms < 2:
        raise ValueError(f"max_terms must be >= 2, got {max_terms}")
    rng = random.Random(f"count-edge:{seed}:{max_terms}")

    def draw() -> tuple[Example, str]:
        step = rng.choice((1, 2, 5, 10))
        terms = rng.randint(2, min(max_terms, 1100 // step + 1))
        span = (terms - 1) * step
        down = rng.random() < 0.5
        kind = rng.random()
        if kind < 0.35:  # starts at or near 0
            low = rng.randint(0, 3 * step)
            if rng.random() < 0.7:
                low -= low % step
        elif kind < 0.8:  # the last value said is within three steps of 10, 100 or 1000
            end = max(0, rng.choice(CROSSINGS) + rng.randint(-3, 3) * step)
            low = end if down else end - span
        else:  # crosses 1000 and ends in 1000..1100 (the four-digit end values)
            high = rng.randint(1000, 1100)
            low = high - span
            if not 0 <= low < 1000:
                low = rng.randint(max(0, 1000 - span), 999)
        low = max(0, min(low, 1100 - span))
        return count_example(low, low + span, step, down)

    return draw_split(n, draw)


def carry_addsub_examples(n: int, seed: int = SEEDS["train"], width: int = 20) -> list[Example]:
    """`n` TRAIN-split two-digit sums and differences whose result is within `width` of a change
    in its number of digits: a + b in 100 - width .. 99 + width, or a - b in 10 - h .. 9 + h with
    h = max(1, width // 2) (three quarters sums, a quarter differences), in the usual format
    ("What is A + B?" -> "A + B = C").

    Why: under streaming decoding the mask at the slot after a two-digit result must say
    `<|im_end|>` without seeing the result's last digit, i.e. it must know that A + B < 100
    from the prompt alone. On validation sums of 79-99 the model wrote the last digit twice
    ("67 + 17 = 844", docs/experiments.md, "Where a sum ends"), while AR decoding, which sees the
    digit, was right. The usual generator draws half sums, 38% of them in the band 80..119 for
    width 20 (19% of its records); here every record is in its band. Small widths hold few
    distinct prompts (width 1: about 290 of the train split), so records repeat.

    Raises:
        ValueError: `width` < 1 or > 21 (beyond 21 a difference could be negative).
    """
    if not 1 <= width <= 21:
        raise ValueError(f"width must be in 1..21, got {width}")
    rng = random.Random(f"addsub-carry:{seed}:{width}")
    h = max(1, width // 2)

    def draw() -> tuple[Example, str]:
        if rng.random() < 0.75:
            c = rng.randint(100 - width, 99 + width)
            a = rng.randint(max(10, c - 99), min(99, c - 10))
            return addsub_example(a, "+", c - a)
        c = rng.randint(10 - h, 9 + h)
        a = rng.randint(max(10, c + 10), 99)
        return addsub_example(a, "-", a - c)

    return draw_split(n, draw)


def tens_count_examples(n: int, seed_name: str = "count-tens", max_terms: int = 30) -> list[Example]:
    """`n` TRAIN-split "Count from A to B in steps of 10." examples (up), 2..`max_terms` terms, A
    uniform in 0..1100 - (terms - 1) * 10; `seed_name` seeds the draws.

    Every value ends in B's last digit, so only the tens and hundreds digits tell where to stop:
    the data on which the 4-layer tiny model first learned to compare more than the last digit
    with B (after ~600 steps with `end_weight` 20; docs/training.md, "The last-digit shortcut").

    Raises:
        ValueError: `max_terms` < 2.
    """
    if max_terms < 2:
        raise ValueError(f"max_terms must be >= 2, got {max_terms}")
    rng = random.Random(seed_name)

    def draw() -> tuple[Example, str]:
        terms = rng.randint(2, max_terms)
        low = rng.randint(0, 1100 - (terms - 1) * 10)
        return count_example(low, low + (terms - 1) * 10, 10)

    return draw_split(n, draw)


def from_small_examples(n: int, seed: int = SEEDS["train"], max_end: int = 320, max_start: int = 10,
                        one: float = 0.6, min_end: int = 0) -> list[Example]:
    """`n` TRAIN-split "Count from A to B." examples (up, step 1) with a small start: A = 1 at a
    share `one`, else A uniform in 0..`max_start`; B uniform in max(A+1, `min_end`)..`max_end`.
    With `min_end` = 100 every range passes a value with B's last two digits one hundred before
    B, so only B's hundreds digit decides where it stops (the misses of the earlier trials).

    Why: the usual generator draws starts uniform in 0..999, so "Count from 1 to N." is rare,
    and the demo range 1..200 (4% of its counting draws) was the one long range from 1 the model
    knew: it counted "Count from 1 to 50." on to 150 or 200. Here the end is all that varies, so
    only reading B from the prompt decides where the answer stops; the demo range keeps its
    natural rate (about one record in 500). Keys follow the split rule: the held-out ends of
    `from_one_heldout` never appear.

    Raises:
        ValueError: `max_start` < 0 or `max_end` <= `max_start`.
    """
    if max_start < 0 or max_end <= max(max_start, min_end):
        raise ValueError(f"need 0 <= max_start < max_end and min_end < max_end, got max_start={max_start}, "
                         f"min_end={min_end}, max_end={max_end}")
    rng = random.Random(f"count-from-small:{seed}:{max_end}:{max_start}:{one}" + (f":{min_end}" if min_end else ""))

    def draw() -> tuple[Example, str]:
        low = 1 if rng.random() < one else rng.randint(0, max_start)
        return count_example(low, rng.randint(max(low + 1, min_end), max_end))

    return draw_split(n, draw)


def from_one_heldout(split: str, ends: range = range(10, 301)) -> list[Example]:
    """The "Count from 1 to N." examples, N in `ends`, whose key falls in `split` ("test" or "val"):
    the held-out prompts next to the demo. No training generator yields them (split rule).

    Raises:
        ValueError: `split` not "test" or "val".
    """
    if split not in SPLIT_BUCKET:
        raise ValueError(f"split must be one of {tuple(SPLIT_BUCKET)}, got {split!r}")
    pairs = (count_example(1, n) for n in ends)
    return [ex for ex, key in pairs if split_of(key) == split]


def build_stop(out: Path, n_short: int, n_replay: int, seed: int = SEEDS["train"] + 1,
               terms: tuple[int, int] = (3, 10), demo: float = 0.04) -> int:
    """Write stop.jsonl: `n_short` short counting records (`terms` = (min, max) terms, demo
    range at a share `demo`) and `n_replay` records of the usual mix (TRAIN_RECORDS
    proportions, seed `seed`, so mostly unseen), shuffled; returns records."""
    rng = random.Random(f"stop:{seed}")
    total = sum(TRAIN_RECORDS.values())
    records = [to_chat(ex) for ex in short_count_examples(n_short, seed, terms[1], terms[0], demo)]
    records += train_chat_records({task: round(n_replay * k / total) for task, k in TRAIN_RECORDS.items()}, seed)
    rng.shuffle(records)
    return write_jsonl(out / "stop.jsonl", records)


def build_mix(out: Path, simple: dict[int, int] | None = None, short: dict[int, int] | None = None,
              replay: dict[str, int] | None = None, seed: int = SEEDS["train"] + 2, demo: float = 0.0,
              simple_forms: dict[int, int] | None = None, distractor: dict[int, int] | None = None,
              distractor2: dict[int, int] | None = None, carry: dict[int, int] | None = None,
              edge: dict[int, int] | None = None, from_small: dict[int, int] | None = None,
              replay_demo: float = 0.04) -> int:
    """Write one shuffled TRAIN-split mix to the file `out`; returns records.

    `simple` maps max terms -> records of `simple_count_examples` (1..max terms, up, step 1);
    `simple_forms` maps max terms -> records of `simple_form_examples` (1..max terms, up or
    down, steps 1/2/5/10);
    `distractor` maps max extra terms -> records of `distractor_count_examples` (every form, the
    end value's last digit seen earlier in the range); `distractor2` the same with the last two
    digits (`digits=2`: ranges of 11 to 150 terms, depending on the step);
    `carry` maps a width -> records of `carry_addsub_examples` (results within the width of a
    change in their number of digits);
    `edge` maps max terms -> records of `edge_count_examples` (ranges that start near 0 or end
    near a change in the number of digits);
    `from_small` maps max end (or "MIN-MAX" ends) -> records of `from_small_examples` ("Count
    from A to B." with A small, any end B in the bounds);
    `short` maps max terms -> records of `short_count_examples` (2..max terms, every counting
    form, demo range at a share `demo`); `replay` maps task -> records of the usual generators,
    the demo range 1..200 at a share `replay_demo` of the counting draws.
    This builds the widening stages after the stop experiments (docs/training.md): the simple
    records keep the end value B read while longer ranges and the other tasks come back.

    Raises:
        ValueError: an unknown task in `replay`, or terms out of range (see the generators).
    """
    records = []
    for max_terms, n in (simple or {}).items():
        records += [to_chat(ex) for ex in simple_count_examples(n, seed, int(max_terms))]
    for max_terms, n in (simple_forms or {}).items():
        records += [to_chat(ex) for ex in simple_form_examples(n, seed, int(max_terms))]
    for max_extra, n in (distractor or {}).items():
        records += [to_chat(ex) for ex in distractor_count_examples(n, seed, int(max_extra))]
    for max_extra, n in (distractor2 or {}).items():
        records += [to_chat(ex) for ex in distractor_count_examples(n, seed, int(max_extra), digits=2)]
    for width, n in (carry or {}).items():
        records += [to_chat(ex) for ex in carry_addsub_examples(n, seed, int(width))]
    for max_terms, n in (edge or {}).items():
        records += [to_chat(ex) for ex in edge_count_examples(n, seed, int(max_terms))]
    for ends, n in (from_small or {}).items():
        min_end, _, max_end = str(ends).rpartition("-")
        records += [to_chat(ex) for ex in from_small_examples(n, seed, int(max_end), min_end=int(min_end or 0))]
    for max_terms, n in (short or {}).items():
        records += [to_chat(ex) for ex in short_count_examples(n, seed, int(max_terms), 2, demo)]
    records += train_chat_records(dict(replay or {}), seed, replay_demo)
    random.Random(f"widen:{seed}").shuffle(records)
    return write_jsonl(Path(out), records)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m wedlm.data.curriculum``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("data/curriculum"))
    p.add_argument("--scale", type=float, default=1.0, help="multiply every record count")
    p.add_argument("--seed", type=int, default=SEEDS["train"],
                   help="train-split seed of every mode (--stop uses SEED+1, --mix SEED+its seed offset)")
    p.add_argument("--stop", type=int, default=0, metavar="N",
                   help="write only stop.jsonl: N short counting records + N of the usual mix")
    p.add_argument("--simple-stop", type=int, default=0, metavar="N",
                   help="write only simple_stop.jsonl: N 1-6-term 'Count from A to B.' records")
    p.add_argument("--tens", type=int, default=0, metavar="N",
                   help="write only the file --out: N 'Count from A to B in steps of 10.' records (tens_count_examples)")
    p.add_argument("--stop-terms", default="3-10", metavar="MIN-MAX",
                   help="terms per short counting record of --stop (default 3-10)")
    p.add_argument("--stop-replay", type=int, default=None, metavar="N",
                   help="records of the usual mix in stop.jsonl (default: as many as --stop)")
    p.add_argument("--stop-demo", type=float, default=0.04,
                   help="share of the demo range 1..200 among the short records (default 0.04)")
    p.add_argument("--mix", default=None, metavar="JSON",
                   help='write only the file --out: a mix, e.g. \'{"simple": {"6": 15000}, "short": {"20": 12000}, '
                        '"replay": {"addsub": 10000}, "seed": 2}\' (seed: offset added to --seed; see build_mix)')
    a = p.parse_args(argv)
    if a.seed == SEEDS["test"]:
        raise SystemExit("--seed 999999 is the test split's seed; pick another")
    if a.mix:
        try:
            spec = json.loads(a.mix)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--mix must be a JSON object: {e}") from e
        if not isinstance(spec, dict):
            raise SystemExit(f"--mix must be a JSON object, got {type(spec).__name__}")
        keys = ("simple", "simple_forms", "distractor", "distractor2", "carry", "edge", "from_small", "short",
                "replay", "seed", "demo", "replay_demo")
        unknown = set(spec) - set(keys)
        if unknown:
            raise SystemExit(f"--mix: unknown keys {sorted(unknown)}; expected {', '.join(keys)}")
        n = build_mix(a.out, spec.get("simple"), spec.get("short"), spec.get("replay"),
                      a.seed + int(spec.get("seed", 2)), float(spec.get("demo", 0.0)), spec.get("simple_forms"),
                      spec.get("distractor"), spec.get("distractor2"), spec.get("carry"), spec.get("edge"),
                      spec.get("from_small"), float(spec.get("replay_demo", 0.04)))
        print(f"{a.out}: {n} records")
        return
    if a.tens:
        n = write_jsonl(a.out, [to_chat(ex) for ex in tens_count_examples(a.tens, "probe-step10-long")])
        print(f"{a.out}: {n} records")
        return
    if a.simple_stop:
        n = write_jsonl(a.out / "simple_stop.jsonl",
                        [to_chat(ex) for ex in simple_count_examples(a.simple_stop, a.seed)])
        print(f"{a.out / 'simple_stop.jsonl'}: {n} records")
        return
    if a.stop:
        lo, _, hi = a.stop_terms.partition("-")
        if not (lo.isdigit() and hi.isdigit()):
            raise SystemExit(f"--stop-terms must be MIN-MAX (e.g. 2-7), got {a.stop_terms!r}")
        replay = a.stop if a.stop_replay is None else a.stop_replay
        n = build_stop(a.out, a.stop, replay, a.seed + 1, terms=(int(lo), int(hi)), demo=a.stop_demo)
        print(f"{a.out / 'stop.jsonl'}: {n} records")
        return
    for name, n in build(a.out, a.scale, a.seed).items():
        print(f"{a.out / name}: {n} records")


if __name__ == "__main__":
    main()
