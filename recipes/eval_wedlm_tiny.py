"""Held-out evaluation of the shipped tiny WeDLM: AR vs WeDLM vs verified, and the mask probe.

    python recipes/eval_wedlm_tiny.py --model models/wedlm-tiny --out runs/wedlm-tiny/eval

Every item comes from the curriculum's TEST split (never trained on, never tuned on), decoded
greedily with the model's own generation_config.json defaults:
1. per task and per operation: accuracy, share of answers that stopped on an end token,
   tokens per forward and p_cache for `ar`, `wedlm` and `verified` (verified must equal ar;
   the number of items where its text differs is reported);
2. "Count from 1 to 200." exact under `wedlm` and `verified` at the default window and at W=32;
3. the mask probe (wedlm/evaluate/mask_probe.py): teacher-forced accuracy by slot distance and
   the calibration of accepted fills, per task, with two plots written next to summary.json;
4. "Count from 1 to N." for the held-out ends N in 10..300 (`curriculum.from_one_heldout`: the
   test and validation keys of that family, none trained on) under `ar` and `wedlm`;
5. the end probe (`end_probe`): teacher-forced probability of `<|im_end|>` where each answer
   ends against its largest value earlier in the answer (does the model stop where the prompt
   says, or by length?), per task over the same items as 1.
Writes summary.json (everything) and prints the markdown tables the model card embeds.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipes import curriculum_suite as suite  # noqa: E402
from wedlm.evaluate.curriculum import score_example  # noqa: E402

DECODINGS = ("ar", "wedlm", "verified")


def scored(exs: list[dict], recs: list[dict]) -> list[dict]:
    """`recs` with "right" decided by the package scorer (`wedlm eval` and `wedlm bench` use it too)."""
    for ex, r in zip(exs, recs):
        r["right"] = score_example(ex, r["text"])
    return recs


def defaults(model: str) -> dict:
    """W, tau, lambda, stop_by_ar and stop_in_run from the model's generation_config.json (every
    `wedlm` run here decodes with them; the stop rule reaches the engine as the model's default)."""
    from wedlm.engine.defaults import model_decoding_defaults

    d = model_decoding_defaults(model)
    return {"window": d["wedlm_window_size"], "tau": d["wedlm_entropy_threshold"],
            "lam": d["wedlm_pos_penalty_factor"], "stop_by_ar": d["wedlm_stop_by_ar"],
            "stop_in_run": d["wedlm_stop_in_run"]}


def count200(model: str, window: int, tau: float, lam: float) -> dict:
    """"Count from 1 to 200." with wedlm and verified at one window size."""
    from wedlm import LLM

    llm = LLM(model=model, wedlm_window_size=window)
    ex = {"task": "count", "op": "up", "prompt": "Count from 1 to 200.",
          "answer": ", ".join(str(i) for i in range(1, 201)), "final": None}
    out = {}
    for decoding in ("ar", "wedlm", "verified"):
        r = scored([ex], suite.run(llm, [ex], decoding, tau, lam))[0]
        out[decoding] = {"exact": r["right"], "stopped": r["stopped"], "tokens": r["decode_tokens"],
                         "forwards": r["decode_forwards"],
                         "tokens_per_forward": r["decode_tokens"] / max(1, r["decode_forwards"]),
                         "wall_s": r["wall_s"], "tail": r["text"][-30:]}
    return out


FROM_ONE_MAX_TOKENS = 1600  # "Count from 1 to 300." is 1,390 answer tokens


def from_one(model: str, d: dict) -> dict:
    """Exact share of the held-out "Count from 1 to N." prompts (test and validation keys, N in
    10..300) under `ar` and `wedlm`, per split, with the ends that failed and what they ended at."""
    from wedlm import LLM
    from wedlm.data import curriculum

    llm = LLM(model=model)
    out = {}
    for split in ("test", "val"):
        exs = curriculum.from_one_heldout(split)
        for dec in ("ar", "wedlm"):
            recs = suite.run(llm, exs, dec, d["tau"], d["lam"], max_tokens=FROM_ONE_MAX_TOKENS)
            wrong = [{"prompt": e["prompt"], "tail": r["text"][-24:]} for e, r in zip(exs, recs) if not r["right"]]
            out.setdefault(dec, {})[split] = {"n": len(exs), "exact": sum(r["right"] for r in recs) / len(exs),
                                              **suite.table(recs)["count"], "wrong": wrong}
        print(json.dumps({dec: out[dec][split]["exact"] for dec in out}), flush=True)
    return out


@functools.lru_cache(maxsize=1)
def probe_model(model: str):
    """(fp32 model in eval mode, tokenizer) for the teacher-forced probes, loaded once per run."""
    from wedlm.model import load_model
    from wedlm.tokenizer import load_tokenizer

    return load_model(model, dtype="float32").eval(), load_tokenizer(model)


def mask_probe(model: str, n: dict, d: dict) -> dict:
    from wedlm.evaluate.mask_probe import probe

    m, tok = probe_model(model)
    out = {}
    for task, k in n.items():
        exs = suite.items("test", {task: k})
        out[task] = probe(m, tok, [(e["prompt"], e["answer"]) for e in exs], d["window"], d["tau"], d["lam"])
    return out


def stop_probe(model: str, n: dict) -> dict:
    """Per task: `end_probe` over `n[task]` test items (is the end token put where the answer ends?)."""
    from wedlm.evaluate.mask_probe import end_probe

    m, tok = probe_model(model)
    return {task: end_probe(m, tok, [(e["prompt"], e["answer"]) for e in suite.items("test", {task: k})])
            for task, k in n.items()}


def plots(summary: dict, out: Path) -> list[str]:
    """slot_accuracy.png and calibration.png from the probe; returns the file names."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probe_res = summary["mask_probe"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for task, r in probe_res.items():
        acc = [a if a is not None else float("nan") for a in r["slot_accuracy"]]
        ax.plot(range(len(acc)), acc, marker="o", label=f"{task} (AR head {r['ar_accuracy']:.3f})")
    ax.set_xlabel("slot distance from the committed prefix")
    ax.set_ylabel("argmax accuracy (teacher-forced)")
    ax.set_title("Mask prediction accuracy by slot distance (test split)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "slot_accuracy.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.6))
    width = 0.8 / max(1, len(probe_res))
    for i, (task, r) in enumerate(probe_res.items()):
        xs, ys, labels = [], [], []
        for j, b in enumerate(r["buckets"]):
            if b["accepted"]:
                xs.append(j + i * width)
                ys.append(b["share_right"])
                labels.append(b["accepted"])
        bars = ax.bar(xs, ys, width=width, label=task)
        for bar, n_acc in zip(bars, labels):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), str(n_acc), ha="center",
                    va="bottom", fontsize=6)
    edges = [f"[{b['entropy_from']:g}, {b['entropy_to']:g})" for b in next(iter(probe_res.values()))["buckets"]]
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(edges))], edges, fontsize=7, rotation=20)
    ax.set_ylim(min(0.5, ax.get_ylim()[0]), 1.02)
    ax.set_xlabel("entropy of the accepted fill (nats)")
    ax.set_ylabel("share of accepted fills that are right")
    ax.set_title(f"Calibration of accepted fills (tau={summary['tau']}, lambda={summary['lambda']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=120)
    plt.close(fig)
    return ["slot_accuracy.png", "calibration.png"]


def markdown(s: dict) -> str:
    """Per task/op table (AR / wedlm / verified) and the count-200 rows."""
    rows = ["| task | n | AR acc | AR stopped | WeDLM acc | WeDLM stopped | WeDLM tokens/fwd | WeDLM p_cache | "
            "verified acc | verified tokens/fwd |", "|---|---|---|---|---|---|---|---|---|---|"]
    by = {d: s["tasks"][d] for d in DECODINGS}
    for key in by["ar"]:
        a, w, v = by["ar"][key], by["wedlm"][key], by["verified"][key]
        rows.append(f"| {key} | {a['n']} | {100 * a['accuracy']:.1f}% | {100 * a['stopped']:.0f}% | "
                    f"{100 * w['accuracy']:.1f}% | {100 * w['stopped']:.0f}% | {w['tokens_per_forward']:.2f} | "
                    f"{w['p_cache']:.2f} | {100 * v['accuracy']:.1f}% | {v['tokens_per_forward']:.2f} |")
    lines = ["\n".join(rows), "",
             "| \"Count from 1 to 200.\" | W | exact | stopped | tokens | forwards | tokens/forward |",
             "|---|---|---|---|---|---|---|"]
    for w_key, res in s["count200"].items():
        for d in DECODINGS:
            r = res[d]
            lines.append(f"| {d} | {w_key} | {r['exact']} | {r['stopped']} | {r['tokens']} | {r['forwards']} | "
                         f"{r['tokens_per_forward']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "models" / "wedlm-tiny"))
    p.add_argument("--out", default=str(REPO / "runs" / "wedlm-tiny" / "eval"))
    p.add_argument("--n-count", type=int, default=100)
    p.add_argument("--n-addsub", type=int, default=200)
    p.add_argument("--n-listops", type=int, default=300)
    p.add_argument("--probe-items", type=int, default=40, help="test items per task for the mask probe")
    p.add_argument("--skip", default="", help="comma list of parts to skip: tasks,count200,from_one,probe,end")
    p.add_argument("--update", action="store_true",
                   help="start from the existing summary.json and replace only the parts that run")
    args = p.parse_args(argv)
    from wedlm import LLM

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    d = defaults(args.model)
    skip = set(args.skip.split(","))
    summary = {"model": args.model, "tau": d["tau"], "lambda": d["lam"], "window": d["window"],
               "stop_by_ar": d["stop_by_ar"], "stop_in_run": d["stop_in_run"]}
    if args.update and (out / "summary.json").is_file():
        summary = {**json.loads((out / "summary.json").read_text()), **summary}
    if "tasks" not in skip:
        exs = suite.items("test", {"count": args.n_count, "addsub": args.n_addsub, "listops": args.n_listops})
        llm = LLM(model=args.model)
        summary["precision"] = llm.engine.precision  # bf16 autocast where the CPU has bf16 matrix units
        recs = {dec: scored(exs, suite.run(llm, exs, dec, d["tau"], d["lam"])) for dec in DECODINGS}
        summary["tasks"] = {dec: suite.table(r, "task/op") for dec, r in recs.items()}
        summary["tasks_total"] = {dec: suite.table(r, "task") for dec, r in recs.items()}
        summary["verified_differs_from_ar"] = sum(a["text"] != v["text"] for a, v in zip(recs["ar"], recs["verified"]))
        (out / "generations.json").write_text(json.dumps(
            [{"prompt": e["prompt"], "answer": e["answer"], **{dec: recs[dec][i]["text"] for dec in DECODINGS}}
             for i, e in enumerate(exs)], indent=0) + "\n")
        print(json.dumps(summary["tasks_total"], indent=1), flush=True)
    if "count200" not in skip:
        summary["count200"] = {f"W={w}": count200(args.model, w, d["tau"], d["lam"])
                               for w in sorted({d["window"], 32})}
        print(json.dumps(summary["count200"], indent=1), flush=True)
    if "from_one" not in skip:
        summary["from_one"] = from_one(args.model, d)
    if "probe" not in skip:
        n = {t: args.probe_items for t in ("count", "addsub", "listops")}
        summary["mask_probe"] = mask_probe(args.model, n, d)
        summary["plots"] = plots(summary, out)
    if "end" not in skip:
        summary["end_probe"] = stop_probe(args.model, {"count": args.n_count, "addsub": args.n_addsub,
                                                       "listops": args.n_listops})
        print(json.dumps(summary["end_probe"], indent=1), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if "tasks" in summary and "count200" in summary:
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
