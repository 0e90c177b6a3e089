"""Slot-cost curves of several precisions side by side: one table and one plot.

    python benchmarks/slot_cost_precisions.py "fp32=OUT1" "bf16 autocast=OUT2" "bf16 weights=OUT3" \
        --plot docs/img/bench_slot_cost_precisions.png > table.md

Each OUT is the `--out-dir` of one `wedlm bench --slot-cost` run (slot_cost.json), e.g. on a CPU
with bf16 units: `--no-autocast` (fp32), `--autocast` (fp32 weights, bf16 matmuls) and
`--dtype bfloat16 --no-autocast` (bf16 weights). Prints a markdown table: ms per forward at
W = 1, 2, 16, 64 slots, the 16-vs-1 ratio (the break-even tokens/forward of `wedlm` at W=16) and
the 16-slot time against the fp32 one-slot time (what a 16-slot `wedlm` step costs against an
fp32 `ar` step). Rows keep the runs' order; every run should cover the same models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wedlm.bench.plots import _plt  # noqa: E402
from wedlm.bench.slot_cost import draw_curve, model_label, style_axis  # noqa: E402


def load(specs: list[str]) -> list[tuple[str, dict]]:
    """[(label, slot_cost.json content)] from "LABEL=DIR" arguments.

    Raises:
        SystemExit: an argument without "=" or a folder without slot_cost.json.
    """
    runs = []
    for spec in specs:
        label, sep, folder = spec.partition("=")
        if not sep:
            raise SystemExit(f"expected LABEL=DIR, got {spec!r}")
        path = Path(folder) / "slot_cost.json"
        if not path.is_file():
            raise SystemExit(f"{path} not found (the --out-dir of a `wedlm bench --slot-cost` run)")
        runs.append((label, json.loads(path.read_text())))
    return runs


def table(runs: list[tuple[str, dict]]) -> str:
    """Markdown rows per model and precision (eager and compiled rows alike, named by mode)."""
    base = {(r["model"], r["mode"]): r["ms"]["1"] for r in runs[0][1]["rows"]}
    lines = ["| model | precision | path | W=1 | W=2 | W=16 | W=64 | 16 vs 1 | W=16 vs first run's W=1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    models = [r["model"] for r in runs[0][1]["rows"] if r["mode"] == runs[0][1]["rows"][0]["mode"]]
    for model in models:
        for label, res in runs:
            for r in res["rows"]:
                if r["model"] != model:
                    continue
                ms = r["ms"]
                ref = base.get((model, r["mode"]))
                cells = [f"{ms[w]:.2f}" if w in ms else "-" for w in ("1", "2", "16", "64")]
                ratio = f"{ms['16'] / ms['1']:.2f}x" if "16" in ms and "1" in ms else "-"
                vs_first = f"{ms['16'] / ref:.2f}x" if ref and "16" in ms else "-"
                lines.append(f"| {model_label(model)} | {label} | {r['mode']} | {' | '.join(cells)} | {ratio} "
                             f"| {vs_first} |")
    return "\n".join(lines)


def plot(runs: list[tuple[str, dict]], path: Path) -> None:
    """ms per forward against W (log-2 x), one panel per model, one line per precision."""
    plt = _plt()
    models = list(dict.fromkeys(r["model"] for r in runs[0][1]["rows"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6))
    for ax, model in zip(axes if len(models) > 1 else [axes], models):
        for i, (label, res) in enumerate(runs):
            for r in res["rows"]:
                if r["model"] == model:
                    draw_curve(ax, r, f"C{i}", f"{label} ({r['mode']})")
        style_axis(ax, model_label(model), fontsize=9)
    prefix = runs[0][1]["config"]["prefix"]
    fig.suptitle(f"Slot cost over a {prefix}-token cached prefix: {runs[0][1].get('machine_line', '')[:60]}",
                 fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=DIR")
    p.add_argument("--plot", type=Path, default=None, help="also write the plot (PNG) here")
    a = p.parse_args(argv)
    runs = load(a.runs)
    print(table(runs))
    if a.plot:
        plot(runs, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
