"""Structured outputs on the shipped model: validity, accuracy, tokens per forward and grammar cost.

    pip install 'wedlm[structured]' jsonschema
    python benchmarks/structured_outputs.py [--model models/wedlm-tiny] [--n 8] [--out-dir docs]

Held-out curriculum prompts (`wedlm.evaluate.curriculum.heldout_examples`; counting limited to
ranges of at most 30 terms) are decoded greedily at batch 1, one request at a time, by every
decoder: unconstrained, and under each constraint of its task:

* sums ("What is A + B?"): the model's own answer format as a regex (`A + B = C`), the JSON
  schema `{"answer": <int>}` (an integer in [-99, 198]) and a nested object
  (`{"question": {"a", "op", "b"}, "answer"}`);
* counting: the regex `\\d+(, \\d+)*` (the model's own format) and a JSON array of integers;
* list operations: a regex of comma-separated names and a JSON array of the names (an enum).

Per row: finished = answers that ended with a stop token; valid = of those, the share that the
constraint accepts (json.loads + jsonschema, or re.fullmatch; must be 100%); accuracy = the
task's answer read from the output (the curriculum scorer, or the JSON field / array); tokens
per forward; the wall-clock time per decode forward against the unconstrained run of the same
task and decoder (the answers differ in length, so whole-answer times are not comparable); and
the grammar's share of the wall time (matcher masks, run checks, window walks and commits,
timed around `GrammarState`'s and `Lookahead`'s methods) with its cost per decode forward. The model never saw JSON in
training, so JSON answers are valid but mostly wrong: validity is what is guaranteed. The
machine is shared: read the times as ratios within one run. With `--out-dir` writes
structured_outputs.json and structured_outputs.md. Nothing here is part of the package.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema  # noqa: E402

from wedlm import LLM, SamplingParams  # noqa: E402
from wedlm.data.curriculum import NAMES  # noqa: E402
from wedlm.engine import structured as backend  # noqa: E402
from wedlm.evaluate.curriculum import heldout_examples, score_example  # noqa: E402

DECODERS = ("ar", "wedlm", "blockwise", "verified")
INT = {"type": "integer", "minimum": -99, "maximum": 198}
SUM_JSON = {"type": "object", "properties": {"answer": INT}, "required": ["answer"], "additionalProperties": False}
SUM_NESTED = {"type": "object", "properties": {
    "question": {"type": "object", "properties": {"a": INT, "op": {"enum": ["+", "-"]}, "b": INT},
                 "required": ["a", "op", "b"], "additionalProperties": False},
    "answer": INT}, "required": ["question", "answer"], "additionalProperties": False}
COUNT_JSON = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1100}, "maxItems": 40}
LIST_JSON = {"type": "array", "items": {"enum": NAMES}, "maxItems": 8}
NAME = "(" + "|".join(NAMES) + ")"
CASES = {  # task -> [(label, structured or None)]
    "addsub": [("none", None), ("regex A op B = C", {"regex": r"\d+ [+-] \d+ = -?\d+"}),
               ('json {"answer": int}', {"json_schema": SUM_JSON}), ("json nested object", {"json_schema": SUM_NESTED})],
    "count": [("none", None), (r"regex \d+(, \d+)*", {"regex": r"\d+(, \d+)*"}),
              ("json array of int", {"json_schema": COUNT_JSON})],
    "listops": [("none", None), ("regex names", {"regex": f"{NAME}(, {NAME})*"}),
                ("json array of names", {"json_schema": LIST_JSON})],
}
MAX_TOKENS = {"addsub": 48, "count": 192, "listops": 64}


def examples(task: str, n: int) -> list[dict]:
    """The first n held-out examples (counting: the first n whose range has at most 30 terms)."""
    if task != "count":
        return heldout_examples(task, n)
    pool = heldout_examples(task, 20 * n)
    return [ex for ex in pool if ex["answer"].count(",") < 30][:n]


def is_valid(structured: dict, text: str) -> bool:
    if "regex" in structured:
        return re.fullmatch(structured["regex"], text) is not None
    try:
        jsonschema.validate(json.loads(text), structured["json_schema"])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def correct(ex: dict, structured: dict | None, text: str) -> bool:
    """The task's answer read from the output (JSON: the field or the array)."""
    if structured is None or "regex" in structured:
        return score_example(ex, text)
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if ex["task"] == "addsub":
        return isinstance(value, dict) and value.get("answer") == int(ex["final"])
    want = ex["answer"].split(", ")
    return value == ([int(v) for v in want] if ex["task"] == "count" else want)


class GrammarClock:
    """Seconds spent in the matcher's methods while installed: `GrammarState`'s (masks, run checks,
    commits) and `Lookahead`'s (the window walk: masks, accepts, the rollback)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.originals = {}

    def install(self) -> None:
        for cls, names in ((backend.GrammarState, ("mask_logits", "valid_prefix", "advance")),
                           (backend.Lookahead, ("forced_token", "mask_row", "accept", "__exit__"))):
            for name in names:
                original = getattr(cls, name)
                self.originals[(cls, name)] = original
                setattr(cls, name, self._timed(original))

    def _timed(self, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return run


def run_case(llm: LLM, prompts: list, exs: list[dict], decoding: str, structured: dict | None,
             max_tokens: int, clock: GrammarClock) -> dict:
    """Batch 1: each prompt alone; totals over the prompts."""
    stop = valid = right = tokens = forwards = 0
    wall = grammar = 0.0
    for prompt, ex in zip(prompts, exs):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, decoding=decoding, structured=structured)
        before = clock.seconds
        start = time.perf_counter()
        out = llm.generate([prompt], params)[0]
        wall += time.perf_counter() - start
        grammar += clock.seconds - before
        tokens += len(out["token_ids"])
        forwards += out["stats"]["decode_forwards"]
        right += correct(ex, structured, out["text"])
        if out["finish_reason"] == "stop":
            stop += 1
            valid += structured is None or is_valid(structured, out["text"])
    return {"n": len(prompts), "finished": stop, "valid": valid, "correct": right, "tokens": tokens,
            "forwards": forwards, "wall_s": wall, "grammar_s": grammar}


def ms_per_forward(row: dict) -> float:
    return 1000 * row["wall_s"] / row["forwards"]


def table(rows: list[dict]) -> str:
    base = {(r["task"], r["decoding"]): r for r in rows if r["constraint"] == "none"}
    lines = ["| task | constraint | decoder | finished | valid | accuracy (unconstrained) | tokens/forward "
             "(unconstrained) | ms/forward vs unconstrained | grammar share of wall | grammar ms per forward |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["constraint"] == "none":
            continue
        b = base[(r["task"], r["decoding"])]
        valid = f"{r['valid']}/{r['finished']}" + (" (100%)" if r["valid"] == r["finished"] else "")
        lines.append(
            f"| {r['task']} | `{r['constraint']}` | {r['decoding']} | {r['finished']}/{r['n']} | {valid} | "
            f"{r['correct']}/{r['n']} ({b['correct']}/{b['n']}) | {r['tokens'] / r['forwards']:.2f} "
            f"({b['tokens'] / b['forwards']:.2f}) | {ms_per_forward(r) / ms_per_forward(b):.2f}x | "
            f"{100 * r['grammar_s'] / r['wall_s']:.1f}% | {1000 * r['grammar_s'] / r['forwards']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/wedlm-tiny")
    parser.add_argument("--n", type=int, default=8, help="held-out prompts per task")
    parser.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=DECODERS)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    llm = LLM(args.model, device="cpu", dtype="float32")
    clock = GrammarClock()
    clock.install()
    tok = llm.tokenizer
    rows = []
    for task, cases in CASES.items():
        exs = examples(task, args.n)
        prompts = [tok.apply_chat_template([{"role": "user", "content": ex["prompt"]}], tokenize=False,
                                           add_generation_prompt=True) for ex in exs]
        for decoding in args.decoders:
            run_case(llm, prompts[:1], exs[:1], decoding, None, MAX_TOKENS[task], clock)  # warm-up
            for label, structured in cases:
                row = run_case(llm, prompts, exs, decoding, structured, MAX_TOKENS[task], clock)
                rows.append({"task": task, "constraint": label, "decoding": decoding, **row})
                print(f"{task:8} {label:24} {decoding:9} finished {row['finished']}/{row['n']} valid "
                      f"{row['valid']} correct {row['correct']} tpf {row['tokens'] / row['forwards']:.2f} "
                      f"wall {row['wall_s']:.2f}s grammar {row['grammar_s']:.3f}s", file=sys.stderr)
    md = table(rows)
    print(md)
    if args.out_dir is not None:
        meta = {"command": " ".join(["python", *sys.argv]), "model": args.model, "n_per_task": args.n,
                "machine": platform.processor() or platform.machine(), "xgrammar": version("xgrammar"),
                "batch": 1, "greedy": True}
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "structured_outputs.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (args.out_dir / "structured_outputs.md").write_text(
            f"# Structured outputs on {Path(args.model).name}\n\n`{meta['command']}` (xgrammar "
            f"{meta['xgrammar']}, batch 1, greedy, {args.n} held-out prompts per task; a shared CPU: "
            f"times are ratios within this run)\n\n{md}\n")


if __name__ == "__main__":
    main()
