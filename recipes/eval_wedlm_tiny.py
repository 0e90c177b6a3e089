"""Held-out evaluation of the shipped tiny WeDLM, AR vs WeDLM decoding (numbers for its model card).

    python recipes/eval_wedlm_tiny.py --model models/wedlm-tiny --out runs/wedlm-tiny/eval

What it measures, every item from seeds/files never used in training:
1. code perplexity on held-out CPython stdlib chunks (data/eval/code_heldout.jsonl);
2. `wedlm eval` on the held-out synthetic suites (counting exact match, arithmetic and
   equation final-answer accuracy) with AR and WeDLM decoding: tokens per forward, p_cache;
3. the paper's demo prompt "Count from 1 to 200." (exact match, tokens per forward);
4. open-ended code completion of held-out stdlib prefixes (tokens per forward, p_cache).
Writes one JSON per part into --out and prints a markdown table (summary.json has it all).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def generate_stats(llm, prompts: list[str], max_tokens: int, decoding: str, tau: float, lam: float) -> tuple[list, dict]:
    """Generate chat prompts; returns (texts, summed stats: tokens, forwards, tokens_per_forward, p_cache)."""
    from wedlm import SamplingParams

    tok = llm.tokenizer
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True), add_special_tokens=False)["input_ids"]
           for p in prompts]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, decoding=decoding,
                            wedlm_entropy_threshold=tau, wedlm_pos_penalty_factor=lam)
    outs = llm.generate(ids, params)
    from wedlm.evaluate.metrics import aggregate

    return [o["text"] for o in outs], aggregate([o["stats"] for o in outs], 1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "models" / "wedlm-tiny"))
    p.add_argument("--out", default=str(REPO / "runs" / "wedlm-tiny" / "eval"))
    p.add_argument("--limit", type=int, default=50, help="items per synthetic task")
    p.add_argument("--tau", type=float, default=None, help="default: generation_config.json's")
    p.add_argument("--lam", type=float, default=None)
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--code-items", type=int, default=16)
    p.add_argument("--skip", default="", help="comma list of parts to skip: ppl,tasks,count200,code")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen_file = Path(args.model) / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    tau = gen.get("wedlm_entropy_threshold", 0.4) if args.tau is None else args.tau
    lam = gen.get("wedlm_pos_penalty_factor", 0.02) if args.lam is None else args.lam
    window = gen.get("wedlm_window_size", 16) if args.window is None else args.window
    skip = set(args.skip.split(","))
    summary = {"model": args.model, "tau": tau, "lambda": lam, "window": window}

    if "ppl" not in skip:
        from wedlm.train.perplexity import perplexity
        summary["code_ppl"] = perplexity(args.model, REPO / "data" / "eval" / "code_heldout.jsonl")
        print("code ppl", summary["code_ppl"], flush=True)

    if "tasks" not in skip:
        from wedlm.cli.main import main as cli
        for decoding in ("ar", "wedlm"):
            path = out / f"tasks_{decoding}.json"
            cli(["eval", "--model", args.model, "--tasks", "counting,arithmetic,equation", "--limit",
                 str(args.limit), "--decoding", decoding, "--threshold", str(tau), "--penalty", str(lam),
                 "--window-size", str(window), "--out", str(path)])
            summary[f"tasks_{decoding}"] = [
                {k: r[k] for k in ("task", "n", "accuracy")} | {
                    "tokens_per_forward": r["metrics"]["tokens_per_forward"], "p_cache": r["metrics"]["p_cache"]}
                for r in json.loads(path.read_text())["results"]]

    from wedlm import LLM
    llm = LLM(model=args.model, wedlm_window_size=window)
    if "count200" not in skip:
        gold = ", ".join(str(i) for i in range(1, 201))
        for decoding in ("ar", "wedlm"):
            texts, stats = generate_stats(llm, ["Count from 1 to 200."], 1024, decoding, tau, lam)
            summary[f"count200_{decoding}"] = {"exact": texts[0].strip() == gold, **stats,
                                               "text_tail": texts[0][-60:]}
            print("count 1..200", decoding, summary[f"count200_{decoding}"], flush=True)

    if "code" not in skip:
        from wedlm.train.data import read_jsonl
        chunks = read_jsonl(REPO / "data" / "eval" / "code_heldout.jsonl", args.code_items)
        prompts = ["Complete this Python code:\n" + c["text"][:600] for c in chunks]
        for decoding in ("ar", "wedlm"):
            _, stats = generate_stats(llm, prompts, 128, decoding, tau, lam)
            summary[f"code_{decoding}"] = stats
            print("code completion", decoding, stats, flush=True)

    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(markdown(summary))
    return 0


def markdown(s: dict) -> str:
    """The model card's evaluation table."""
    rows = ["| task | metric | AR | WeDLM | WeDLM tokens/forward | WeDLM p_cache |", "|---|---|---|---|---|---|"]
    by = {d: {r["task"]: r for r in s.get(f"tasks_{d}", [])} for d in ("ar", "wedlm")}
    for task in by["wedlm"]:
        a, w = by["ar"].get(task, {}), by["wedlm"][task]
        metric = "exact match" if task == "counting" else "final-answer accuracy"
        rows.append(f"| {task} (n={w['n']}) | {metric} | {100 * a.get('accuracy', 0):.1f}% | "
                    f"{100 * w['accuracy']:.1f}% | {w['tokens_per_forward']:.2f} | {w['p_cache']:.2f} |")
    for d in ("count200",):
        if f"{d}_wedlm" in s:
            a, w = s[f"{d}_ar"], s[f"{d}_wedlm"]
            rows.append(f"| \"Count from 1 to 200.\" | exact match | {a['exact']} | {w['exact']} | "
                        f"{w['tokens_per_forward']:.2f} | {w['p_cache']:.2f} |")
    if "code_wedlm" in s:
        w = s["code_wedlm"]
        ppl = s.get("code_ppl", {}).get("ppl", float("nan"))
        rows.append(f"| held-out stdlib code | perplexity (teacher-forced) / completion | ppl {ppl:.2f} | "
                    f"ppl {ppl:.2f} | {w['tokens_per_forward']:.2f} | {w['p_cache']:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
