"""Tune the tiny model's WeDLM decoding defaults (window W, tau, lambda, stop rule) on the VALIDATION split.

    python recipes/tune_decoding.py --model models/wedlm-tiny --out runs/wedlm-tiny/tune.json --write

Every setting decodes the same validation items (curriculum split "val": disjoint from training
and from the test split the model card reports) with `wedlm`; `ar` on the same items is the
reference. The pick: among settings whose accuracy on every task is at least AR's minus
`--slack` (default 0.5 points), the one with the most tokens per forward over all items (ties:
the lower tau); when no setting is that close, the one closest to AR (the smallest loss on its
worst task, where losses within `--tie` of the smallest count as equal, default one item of the
smallest task: a one-item difference is noise and must not halve the speed; among those the most
tokens per forward), recorded as rule "closest to AR" in the output.
`--pairs TAU:LAMBDA,...` tries those settings instead of the `--taus` x `--lams` grid, each
with every `--stop-by-ar` value (0 = Algorithm 1's stops; 1 = only the AR head ends an answer,
`wedlm_stop_by_ar`; run = that, and a mask may also end it when every mask to its left is filled
in the same forward, `wedlm_stop_in_run`; default 0,1).
With --write it goes into the model's generation_config.json (atomically).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipes import curriculum_suite as suite  # noqa: E402


def summarize(recs: list[dict]) -> dict:
    toks = sum(r["decode_tokens"] for r in recs)
    fwd = sum(r["decode_forwards"] for r in recs)
    return {"tasks": suite.table(recs, "task"), "tokens_per_forward": toks / max(1, fwd)}


def within_slack(worst_loss: float, slack: float) -> bool:
    """A loss of exactly `slack` counts as within it (0.92 - 0.915 is 0.005000000000000004 in floats)."""
    return worst_loss <= slack + 1e-9


def pick(grid: list[dict], tie: float = 0.0) -> tuple[dict, str]:
    """The setting to ship and the rule that chose it (see the module docstring).

    Each row needs "ok" (every task within the slack), "worst_loss" (AR accuracy minus this
    setting's, on its worst task, a fraction), "tokens_per_forward" and "tau". `tie` (a fraction):
    worst-task losses within it of the smallest count as equal in the "closest to AR" rule.

    Raises:
        ValueError: an empty grid or a negative `tie`.
    """
    if not grid:
        raise ValueError("tune: empty grid")
    if tie < 0:
        raise ValueError(f"tune: tie must be >= 0, got {tie}")
    ok = [r for r in grid if r["ok"]]
    if ok:
        return max(ok, key=lambda r: (r["tokens_per_forward"], -r["tau"])), "within slack"
    least = min(r["worst_loss"] for r in grid)
    close = [r for r in grid if r["worst_loss"] <= least + tie + 1e-9]
    return max(close, key=lambda r: (r["tokens_per_forward"], -r["worst_loss"], -r["tau"])), "closest to AR"


def settings(windows: str, taus: str, lams: str, pairs: str | None = None,
             stop_by_ar: str = "0") -> list[tuple[int, float, float, bool, bool]]:
    """(W, tau, lambda, stop_by_ar, stop_in_run) to try: every window times the tau x lambda
    grid, or times `pairs` ("TAU:LAMBDA,..."), times each stop rule in `stop_by_ar` ("0,1,run":
    0 = (False, False), 1 = (True, False), run = (True, True)), in the order given.

    Raises:
        ValueError: a pair that is not TAU:LAMBDA with two numbers, or a stop rule other than
            0, 1 or run (names it).
    """
    ws = [int(w) for w in windows.split(",")]
    if pairs is None:
        grid = list(itertools.product(map(float, taus.split(",")), map(float, lams.split(","))))
    else:
        grid = []
        for pair in pairs.split(","):
            parts = pair.split(":")
            try:
                if len(parts) != 2:
                    raise ValueError
                grid.append((float(parts[0]), float(parts[1])))
            except ValueError:
                raise ValueError(f"--pairs: expected TAU:LAMBDA (two numbers), got {pair!r}") from None
    stops = []
    for v in stop_by_ar.split(","):
        if v not in ("0", "1", "run"):
            raise ValueError(f"--stop-by-ar: expected 0, 1 or run, got {v!r}")
        stops.append((v != "0", v == "run"))
    return [(w, tau, lam, *s) for w in ws for tau, lam in grid for s in stops]


def main(argv: list[str] | None = None) -> int:
    from wedlm import LLM

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "models" / "wedlm-tiny"))
    p.add_argument("--out", default=str(REPO / "runs" / "wedlm-tiny" / "tune.json"))
    p.add_argument("--windows", default="16")
    p.add_argument("--taus", default="0.1,0.2,0.3,0.4,0.6")
    p.add_argument("--lams", default="0,0.02,0.05")
    p.add_argument("--pairs", default=None,
                   help="TAU:LAMBDA,... settings to try instead of the --taus x --lams grid "
                        "(e.g. 0.1:0.02,0.05:0.004), each at every --windows")
    p.add_argument("--stop-by-ar", default="0,1",
                   help="stop rules to try with each setting: 0 (Algorithm 1), 1 (wedlm_stop_by_ar), run "
                        "(wedlm_stop_by_ar and wedlm_stop_in_run), comma-separated; default 0,1")
    p.add_argument("--n", default="count=60,addsub=100,listops=120", help="validation items per task")
    p.add_argument("--slack", type=float, default=0.005, help="allowed accuracy loss vs AR per task")
    p.add_argument("--tie", type=float, default=None,
                   help="worst-task losses within this of the smallest are equal (default: 1 / smallest n)")
    p.add_argument("--write", action="store_true", help="write the pick into generation_config.json")
    args = p.parse_args(argv)
    n = {k: int(v) for k, v in (kv.split("=") for kv in args.n.split(","))}
    tie = 1.0 / min(n.values()) if args.tie is None else args.tie
    exs = suite.items("val", n)
    llms = {}
    ar = summarize(suite.run(llms.setdefault(16, LLM(model=args.model, wedlm_window_size=16)), exs, "ar", 0, 0))
    print("ar", json.dumps(ar), flush=True)
    grid = []
    for w, tau, lam, stop, in_run in settings(args.windows, args.taus, args.lams, args.pairs, args.stop_by_ar):
        llm = llms.get(w) or llms.setdefault(w, LLM(model=args.model, wedlm_window_size=w))
        r = {"window": w, "tau": tau, "lambda": lam, "stop_by_ar": stop, "stop_in_run": in_run,
             **summarize(suite.run(llm, exs, "wedlm", tau, lam, stop, in_run))}
        r["worst_loss"] = max(ar["tasks"][t]["accuracy"] - r["tasks"][t]["accuracy"] for t in n)
        r["ok"] = within_slack(r["worst_loss"], args.slack)
        grid.append(r)
        print(json.dumps({k: r[k] for k in ("window", "tau", "lambda", "stop_by_ar", "stop_in_run", "tokens_per_forward",
                                            "ok")}),
              {t: round(r["tasks"][t]["accuracy"], 3) for t in n}, flush=True)
    best, rule = pick(grid, tie)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"split": "val", "n": n, "slack": args.slack, "tie": tie, "ar": ar, "grid": grid,
                                          "best": best, "rule": rule}, indent=1) + "\n")
    print(f"best ({rule}):", json.dumps({k: best[k] for k in ("window", "tau", "lambda", "stop_by_ar", "stop_in_run", "tokens_per_forward",
                                                              "worst_loss")}))
    if args.write:
        path = Path(args.model) / "generation_config.json"
        gen = json.loads(path.read_text())
        gen.update(wedlm_window_size=best["window"], wedlm_entropy_threshold=best["tau"],
                   wedlm_pos_penalty_factor=best["lambda"], wedlm_stop_by_ar=best["stop_by_ar"],
                   wedlm_stop_in_run=best["stop_in_run"])
        tmp = path.with_name(".generation_config.json.tmp")
        tmp.write_text(json.dumps(gen, indent=2) + "\n")
        os.replace(tmp, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
