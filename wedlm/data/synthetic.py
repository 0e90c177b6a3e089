"""Synthetic tasks for training and evaluating the tiny WeDLM model.

What: generators for low-entropy sequences (counting, alphabet ranges,
multiplication tables, repeated lists) and for multi-step integer reasoning
(arithmetic word problems, linear equations), each producing
``{"task", "prompt", "answer", "final"}`` dicts, plus renderings as plain
pretraining text and as chat SFT records.

Why: WeDLM's speed-ups are largest on low-entropy text (counting 1..200 is the
paper's headline demo) and on structured math (§6.6); a ~3M-parameter model
trained for an hour on 2 CPU cores can learn these, and their answers can be
checked exactly. Ranges and numbers are random so that the model has to read
the prompt to know where to start and stop.

Split rule (documented contract, tests pin it):
- training draws use seeds ``TRAIN_BASE_SEED + offset`` (offset >= 0);
- held-out evaluation uses ``HELDOUT_SEED`` (999_999), which training refuses;
- on top of that, every example has a *key* (the (start, end, step) range for
  counting tasks, the prompt string otherwise); keys whose stable hash falls in
  bucket 0 of ``HELDOUT_BUCKETS`` are held out: training never yields them and
  held-out sampling yields only them. Keys in ``PINNED_TRAIN_KEYS`` (the
  benchmark prompt "Count from 1 to 200.") always stay in training.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable

TRAIN_BASE_SEED = 1234
HELDOUT_SEED = 999_999
HELDOUT_BUCKETS = 20  # 1 key in 20 (5%) is reserved for evaluation
PINNED_TRAIN_KEYS = frozenset({"counting:1:200:1"})

Example = dict  # {"task": str, "prompt": str, "answer": str, "final": str | None}

NAMES = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Emma",
         "Jack", "Ivy", "Noah", "Ava", "Eli", "Ruby"]
ITEMS = ["apples", "pens", "books", "cards", "coins", "eggs", "marbles", "stickers",
         "cookies", "shells", "stamps", "candies", "balls", "flowers"]
CONTAINERS = ["bags", "boxes", "packs", "baskets", "jars"]
WORDS = ["apple", "cat", "blue", "tree", "yes", "dog", "sun", "red", "hello", "one",
         "star", "moon", "book", "go", "hi", "ok"]


def stable_hash(text: str) -> int:
    """Return a process-independent 64-bit hash of ``text`` (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def is_heldout_key(key: str) -> bool:
    """True when an example with this key belongs to the held-out split."""
    if key in PINNED_TRAIN_KEYS:
        return False
    return stable_hash(key) % HELDOUT_BUCKETS == 0


def _example(task: str, prompt: str, answer: str, final: str | None, key: str) -> tuple[Example, str]:
    return {"task": task, "prompt": prompt, "answer": answer, "final": final}, key


def _join(values: list) -> str:
    return ", ".join(str(v) for v in values)


# ---------------------------------------------------------------- counting ---

def _count_range(rng: random.Random) -> tuple[int, int, int]:
    """Draw (start, end, step) for a counting prompt: start 0..300, 1..200 terms."""
    if rng.random() < 0.05:
        return 1, 200, 1
    step = rng.choice([1] * 6 + [2, 3, 5, 10])
    terms = rng.randint(1, 50) if rng.random() < 0.5 else rng.randint(1, 200)
    start = rng.randint(0, 300)
    if step == 2:
        start -= start % 2
    return start, start + (terms - 1) * step, step


def gen_counting(rng: random.Random) -> tuple[Example, str]:
    """Counting up or down, by one, by evens/odds or by a fixed step."""
    start, end, step = _count_range(rng)
    if (start, end, step) == (1, 200, 1):
        prompt = rng.choice(["Count from 1 to 200.", "Count from 1 to 200.", "count from 1 to 200"])
        return _example("counting", prompt, _join(range(1, 201)), None, "counting:1:200:1")
    down = step != 2 and rng.random() < 0.25
    values = list(range(start, end + 1, step))
    if down:
        values.reverse()
        prompt = f"Count down from {end} to {start}" + ("" if step == 1 else f" in steps of {step}")
    elif step == 1:
        prompt = rng.choice([f"Count from {start} to {end}", f"count from {start} to {end}",
                             f"List the numbers from {start} to {end}"])
    elif step == 2:
        parity = "even" if start % 2 == 0 else "odd"
        prompt = f"List the {parity} numbers from {start} to {end}"
    else:
        prompt = f"Count from {start} to {end} in steps of {step}"
    if not prompt.startswith("count "):
        prompt += "."
    return _example("counting", prompt, _join(values), None, f"counting:{start}:{end}:{step}")


def gen_sequence(rng: random.Random) -> tuple[Example, str]:
    """Other low-entropy formats: alphabet ranges, multiplication tables, repeated words."""
    kind = rng.choice(["alphabet", "table", "repeat"])
    if kind == "alphabet":
        letters = rng.choice([string.ascii_lowercase, string.ascii_uppercase])
        i = rng.randint(0, 24)
        j = rng.randint(i + 1, 25)
        prompt = f"List the letters from {letters[i]} to {letters[j]}."
        return _example("sequence", prompt, _join(letters[i:j + 1]), None, prompt)
    if kind == "table":
        n = rng.randint(2, 20)
        upto = rng.choice([5, 10, 10, 12])
        prompt = f"Write the multiplication table of {n} up to {upto}."
        answer = "\n".join(f"{n} x {k} = {n * k}" for k in range(1, upto + 1))
        return _example("sequence", prompt, answer, None, prompt)
    word = rng.choice(WORDS)
    times = rng.randint(2, 30)
    prompt = f"Repeat the word \"{word}\" {times} times."
    return _example("sequence", prompt, _join([word] * times), None, prompt)


# -------------------------------------------------------------- arithmetic ---

def _word_problem(rng: random.Random) -> tuple[str, list[str], int]:
    """A story with 2-4 computation lines; returns (prompt, step lines, result)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(2, 60)
    sentences = [f"{name} has {total} {item}."]
    steps: list[str] = []
    target = rng.randint(2, 4)
    while len(steps) < target:
        op = rng.choice(["buy_bags", "find", "lose", "double"] if target - len(steps) >= 2
                        else ["find", "lose", "double"])
        if op == "buy_bags":
            bags, per = rng.randint(2, 9), rng.randint(2, 12)
            cont = rng.choice(CONTAINERS)
            sentences.append(f"{name} buys {bags} {cont} of {per} {item}.")
            steps.append(f"{bags} x {per} = {bags * per}")
            steps.append(f"{total} + {bags * per} = {total + bags * per}")
            total += bags * per
        elif op == "find":
            k = rng.randint(1, 40)
            sentences.append(f"{name} finds {k} more {item}.")
            steps.append(f"{total} + {k} = {total + k}")
            total += k
        elif op == "lose" and total >= 2:
            k = rng.randint(1, min(total - 1, 60))
            sentences.append(f"{name} gives away {k} {item}.")
            steps.append(f"{total} - {k} = {total - k}")
            total -= k
        elif op == "double" and total <= 99:
            k = rng.choice([2, 2, 3])
            verb = {2: "doubles", 3: "triples"}[k]
            sentences.append(f"Then the number of {item} {name} has {verb}.")
            steps.append(f"{total} x {k} = {total * k}")
            total *= k
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), steps, total


def _expression(rng: random.Random) -> tuple[str, list[str], int]:
    """A bare left-to-right expression like "(12 + 7) x 3 - 5" with 2-4 operations."""
    value = rng.randint(1, 50)
    text, steps = str(value), []
    for i in range(rng.randint(2, 4)):
        op = rng.choice(["+", "-", "x"])
        if op == "x" and value > 99:
            op = "-"
        if op == "-" and value < 2:
            op = "+"
        if op == "x":
            k = rng.randint(2, 9)
            new = value * k
        elif op == "-":
            k = rng.randint(1, min(99, value - 1))
            new = value - k
        else:
            k = rng.randint(1, 99)
            new = value + k
        steps.append(f"{value} {op} {k} = {new}")
        text = f"{text} {op} {k}" if i == 0 else f"({text}) {op} {k}"
        value = new
    return f"Compute {text}.", steps, value


def gen_arithmetic(rng: random.Random) -> tuple[Example, str]:
    """Multi-step word problem or expression; one computation per answer line."""
    prompt, steps, result = (_word_problem if rng.random() < 0.7 else _expression)(rng)
    answer = "\n".join(steps + [f"Final answer: {result}"])
    return _example("arithmetic", prompt, answer, str(result), prompt)


# ---------------------------------------------------------------- equation ---

def gen_equation(rng: random.Random) -> tuple[Example, str]:
    """Linear equation in x with an integer solution, solved in one or two lines."""
    x = rng.randint(0, 30)
    a = rng.randint(2, 12)
    b = rng.randint(1, 60)
    form = rng.choice(["ax+b", "ax+b", "ax-b", "ax", "x+b"])
    if form == "ax-b" and a * x < 1:
        form = "ax+b"
    if form == "ax-b":
        b = rng.randint(1, min(60, a * x))  # keep c = ax - b non-negative
    if form == "ax+b":
        c = a * x + b
        prompt = f"Solve {a}x + {b} = {c}."
        steps = [f"{a}x = {c} - {b} = {a * x}", f"x = {a * x} / {a} = {x}"]
    elif form == "ax-b":
        c = a * x - b
        prompt = f"Solve {a}x - {b} = {c}."
        steps = [f"{a}x = {c} + {b} = {a * x}", f"x = {a * x} / {a} = {x}"]
    elif form == "ax":
        prompt = f"Solve {a}x = {a * x}."
        steps = [f"x = {a * x} / {a} = {x}"]
    else:
        prompt = f"Solve x + {b} = {x + b}."
        steps = [f"x = {x + b} - {b} = {x}"]
    answer = "\n".join(steps + [f"Final answer: {x}"])
    return _example("equation", prompt, answer, str(x), prompt)


GENERATORS: dict[str, Callable[[random.Random], tuple[Example, str]]] = {
    "counting": gen_counting,
    "sequence": gen_sequence,
    "arithmetic": gen_arithmetic,
    "equation": gen_equation,
}
TASKS = tuple(GENERATORS)


# ----------------------------------------------------------------- sampling ---

def sample_examples(task: str, n: int, seed: int, split: str = "train") -> list[Example]:
    """Draw ``n`` examples of ``task`` deterministically from ``seed``.

    Args:
        task: one of ``TASKS``.
        n: number of examples.
        seed: integer seed; the RNG is ``random.Random(f"{task}:{seed}")`` so tasks
            are independent streams.
        split: "train" (rejects held-out keys; refuses ``HELDOUT_SEED``) or
            "heldout" (keeps only held-out keys).
    Returns:
        list of example dicts ``{"task", "prompt", "answer", "final"}``.
    Raises:
        ValueError: unknown task/split, or the held-out seed used for training.
    """
    if task not in GENERATORS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if split == "train" and seed == HELDOUT_SEED:
        raise ValueError("the held-out seed 999_999 must never be used for training")
    rng, gen, want_heldout = random.Random(f"{task}:{seed}"), GENERATORS[task], split == "heldout"
    out: list[Example] = []
    while len(out) < n:
        example, key = gen(rng)
        if is_heldout_key(key) == want_heldout:
            out.append(example)
    return out


def train_examples(task: str, n: int, offset: int = 0, base_seed: int = TRAIN_BASE_SEED) -> list[Example]:
    """Training examples drawn with seed ``base_seed + offset`` (never held-out keys)."""
    return sample_examples(task, n, base_seed + offset, split="train")


def heldout_examples(task: str, n: int) -> list[Example]:
    """Held-out evaluation examples: seed ``HELDOUT_SEED``, held-out keys only."""
    return sample_examples(task, n, HELDOUT_SEED, split="heldout")


# --------------------------------------------------------------- rendering ---

def to_text(example: Example) -> str:
    """Plain pretraining rendering: ``prompt + "\\n" + answer``."""
    return f"{example['prompt']}\n{example['answer']}"


def to_chat(example: Example) -> dict:
    """Chat SFT rendering: ``{"messages": [user prompt, assistant answer]}``."""
    return {"messages": [{"role": "user", "content": example["prompt"]},
                         {"role": "assistant", "content": example["answer"]}]}
