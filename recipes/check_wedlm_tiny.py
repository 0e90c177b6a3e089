"""Quick VALIDATION-split check of a tiny WeDLM checkpoint: is a training stage worth keeping?

    python recipes/check_wedlm_tiny.py MODEL [--bands 1-6,7-20,21-60] [--n 20] [--json OUT]

MODEL is an exported folder or a training checkpoint (a `final/` or `step-*/` folder with
config.json and model.safetensors; the tokenizer and generation_config.json come from
`--defaults`, models/wedlm-tiny, when the folder has none). Decodes greedily with `ar` and `wedlm`
(the defaults' W, tau, lambda) and prints one row per group:
- `count A-B`: `--n` counting items of every form (up, down, steps 1/2/5/10) with A..B terms;
- `short up`: `--n` x 2 "Count from A to B." items of 1-15 terms (does it read the end value B?);
- `addsub`, `listops`: `--n` items each of the curriculum's generators.
Below the table, the `ar` misses of each counting group by kind (`count_miss`): "early at B's last
digit" (stopped at a right prefix whose last value ends like B: the last-digit shortcut of
docs/training.md), "early at B's last two digits" (the same with two digits, "525" for B = 625),
"early" (another right prefix), "late" (right through B, stopped later),
"runaway" (no end token), "wrong numbers".
All items come from the validation split (`wedlm.data.curriculum.split_of`), never from the
test split the model card reports, so a stage can be judged without touching the test set.
Then, teacher-forced on the same counting items (`stop_probe`), the probability of `<|im_end|>`
right after each value of the right answer, from the AR head (next-token logits of the value's
last digit) and from a [MASK] slot placed after it (the slot that decides the stop under
`wedlm`), averaged separately over B, over earlier values ending like B (where the last-digit
shortcut would stop), and over the other values: a model that reads B has high / low / low.
Takes about 2 minutes on two quiet cores at --n 20.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipes import curriculum_suite as suite  # noqa: E402
from wedlm.data import curriculum  # noqa: E402

SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def count_band(lo: int, hi: int, n: int) -> list[dict]:
    """`n` validation-split counting items of every form with `lo`..`hi` terms (no demo range).

    Raises:
        ValueError: `lo` < 1 or `hi` < `lo`.
    """
    if lo < 1 or hi < lo:
        raise ValueError(f"band must be 1 <= A <= B, got {lo}-{hi}")
    rng = random.Random(f"check:count:{lo}:{hi}")

    def draw() -> tuple[dict, str]:
        step = rng.choice(curriculum.STEPS)
        terms = min(rng.randint(lo, hi), 1100 // step + 1)
        low = rng.randint(0, 1100 - (terms - 1) * step)
        return curriculum.count_example(low, low + (terms - 1) * step, step, down=rng.random() < 0.3)

    return curriculum.draw_split(n, draw, "val")


def short_up(n: int) -> list[dict]:
    """`n` validation-split "Count from A to B." items of 1..15 terms (step 1, up)."""
    rng = random.Random("check:short-up")

    def draw() -> tuple[dict, str]:
        terms = rng.randint(1, 15)
        low = rng.randint(0, 1000 - terms)
        return curriculum.count_example(low, low + terms - 1)

    return curriculum.draw_split(n, draw, "val")


def count_miss(ex: dict, rec: dict) -> str | None:
    """None when `rec` (a `curriculum_suite.run` record) answers the counting item `ex` right, else
    the kind of miss: "runaway" (no end token), "early at B's last two digits" / "early at B's
    last digit" / "early" (stopped at a right prefix), "late" (right up to B, stopped after it) or
    "wrong numbers"."""
    if rec["right"]:
        return None
    want, got = ex["answer"].split(", "), rec["text"].strip().split(", ")
    if not rec["stopped"]:
        return "runaway"
    if len(got) < len(want) and got == want[:len(got)]:
        if got[-1][-2:] == want[-1][-2:] and len(want[-1]) > 1:
            return "early at B's last two digits"
        return "early at B's last digit" if got[-1][-1:] == want[-1][-1:] else "early"
    if len(got) > len(want) and got[:len(want)] == want:
        return "late"
    return "wrong numbers"


def stop_probe(model_dir: Path, groups: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, float]]]:
    """Teacher-forced P(`<|im_end|>`) after each value of the right answers of the counting items
    of each group in `groups` (the model is loaded once for all of them).

    For each prefix "prompt + v1, ..., vk" two readings: `ar`, the AR head's next-token
    distribution at vk's last token; `mask`, a [MASK] slot at the next logical position, the
    slot that decides the stop under `wedlm` decoding (W=1, distance 0). Values are grouped as
    "at B" (the last value), "ending like B" (earlier values with B's last digit) and "other".

    Returns:
        {group name: {value group: {"n": count, "ar": mean P, "mask": mean P, "ar>0.5": share
        above 0.5, "mask>0.5": share}}}; float32 weights, one forward (no KV cache) per prefix.
        An AR checkpoint (no `mask_token_id` in its config: an AR stage before conversion) has
        no mask reading: "mask" and "mask>0.5" are None.
    """
    import torch

    from wedlm.model.attention import DenseAttention
    from wedlm.model.loader import load_model
    from wedlm.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    model = load_model(model_dir).eval()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    mask_id = model.config.mask_token_id

    def probe(items: list[dict]) -> dict[str, dict[str, float]]:
        probs: dict[str, dict[str, list[float]]] = {}
        for ex in items:
            prompt = tok.apply_chat_template([{"role": "user", "content": ex["prompt"]}], tokenize=False,
                                             add_generation_prompt=True)
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            values = ex["answer"].split(", ")
            for k, v in enumerate(values):
                ids = ids + tok((", " if k else "") + v, add_special_tokens=False)["input_ids"]
                group = "at B" if k == len(values) - 1 else ("ending like B" if v[-1] == values[-1][-1] else "other")
                x = torch.tensor([ids + ([] if mask_id is None else [mask_id])])
                with torch.no_grad():
                    p = model(x, torch.arange(x.shape[1])[None], DenseAttention(),
                              torch.arange(len(ids) - 1, x.shape[1]))
                p = p.float().softmax(-1)[:, end].tolist()
                g = probs.setdefault(group, {"ar": [], "mask": []})
                g["ar"].append(p[0])
                if mask_id is not None:
                    g["mask"].append(p[1])

        def mean(v):
            return sum(v) / len(v) if v else None

        return {name: {"n": len(g["ar"]), "ar": mean(g["ar"]), "mask": mean(g["mask"]),
                       "ar>0.5": mean([q > 0.5 for q in g["ar"]]), "mask>0.5": mean([q > 0.5 for q in g["mask"]])}
                for name, g in probs.items()}

    return {name: probe(items) for name, items in groups.items()}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def with_side_files(model: Path, defaults: Path) -> Path:
    """`model` itself when it has every side file, else a temporary copy with the missing ones."""
    if all((model / f).is_file() for f in SIDE_FILES):
        return model
    tmp = Path(tempfile.mkdtemp(prefix="wedlm-check-"))
    for f in model.iterdir():
        if f.is_file():
            shutil.copy(f, tmp / f.name)  # copied: a training run may rotate the checkpoint meanwhile
    for f in SIDE_FILES:
        if not (tmp / f).is_file():
            shutil.copy(defaults / f, tmp / f)
    return tmp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--bands", default="1-6,7-20,21-60", help="comma list of A-B term bands for counting")
    p.add_argument("--n", type=int, default=20, help="items per group")
    p.add_argument("--defaults", default=str(REPO / "models" / "wedlm-tiny"),
                   help="folder whose tokenizer / generation_config.json fill what MODEL lacks")
    p.add_argument("--json", default=None, help="also write the table here as JSON")
    args = p.parse_args(argv)
    from recipes.eval_wedlm_tiny import defaults
    from wedlm import LLM

    model = with_side_files(Path(args.model), Path(args.defaults))
    d = defaults(str(model))
    groups: dict[str, list[dict]] = {}
    for band in args.bands.split(","):
        lo, hi = (int(x) for x in band.split("-"))
        groups[f"count {lo}-{hi}"] = count_band(lo, hi, args.n)
    groups["short up"] = short_up(2 * args.n)
    groups["addsub"] = curriculum.examples("addsub", args.n, "val")
    groups["listops"] = curriculum.examples("listops", args.n, "val")
    llm = LLM(model=str(model))
    exs = [ex for g in groups.values() for ex in g]
    recs = {dec: suite.run(llm, exs, dec, d["tau"], d["lam"]) for dec in ("ar", "wedlm")}
    table: dict[str, dict] = {}
    i = 0
    print(f"{args.model}  (W={d['window']}, tau={d['tau']}, lambda={d['lam']}; validation split)")
    print(f"{'group':<14} {'n':>3}  {'ar right':>8} {'ar stop':>7}  {'wedlm right':>11} {'wedlm stop':>10} {'tok/fwd':>7}")
    for name, g in groups.items():
        # every group holds one task, so its "task" table has a single row
        row = {dec: next(iter(suite.table(recs[dec][i:i + len(g)], "task").values())) for dec in ("ar", "wedlm")}
        i += len(g)
        table[name] = {"n": len(g), **row}
        a, w = row["ar"], row["wedlm"]
        print(f"{name:<14} {len(g):>3}  {round(a['accuracy'] * len(g)):>4}/{len(g):<3} {100 * a['stopped']:>6.0f}%  "
              f"{round(w['accuracy'] * len(g)):>7}/{len(g):<3} {100 * w['stopped']:>9.0f}% {w['tokens_per_forward']:>7.2f}")
    i = 0
    for name, g in groups.items():
        if name.startswith("count") or name == "short up":
            kinds = Counter(count_miss(ex, rec) for ex, rec in zip(g, recs["ar"][i:i + len(g)]))
            kinds.pop(None, None)
            table[name]["ar_misses"] = dict(kinds)
            print(f"ar misses, {name}: " + (", ".join(f"{k} {v}" for k, v in kinds.most_common()) or "none"))
        i += len(g)
    print("teacher-forced P(<|im_end|>) after a value, AR head / mask slot (share > 0.5):")
    counting = {name: g for name, g in groups.items() if name.startswith("count") or name == "short up"}
    for name, probe in stop_probe(model, counting).items():
        table[name]["stop_probe"] = probe
        print(f"  {name}: " + "; ".join(f"{k} {v['ar']:.2f} / {_num(v['mask'], '.2f')} "
                                        f"({v['ar>0.5']:.0%} / {_num(v['mask>0.5'], '.0%')})"
                                        for k, v in sorted(probe.items())))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "defaults": d, "groups": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
