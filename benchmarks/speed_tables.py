"""Markdown tables of `wedlm bench` runs side by side: engine vs transformers per forward path.

    python benchmarks/speed_tables.py OUT
    python benchmarks/speed_tables.py --run "BLAS=DIR1" --run "oneDNN=DIR2" --plot ratios.png

Reads OUT/eager/benchmarks.json and OUT/compiled/benchmarks.json (the two `wedlm bench`
runs of scripts/cpu_speed.sh) and prints, per task and batch size, tokens/s of transformers
`generate`, engine `ar`, `wedlm` and `verified`, and engine `ar` / transformers within each
run (the ratio the speed targets are stated in; each run has its own transformers column, so
load drifts between the runs cancel in the ratios). Then OUT/times.txt (wall clock of each part) when present.
`--run LABEL=DIR` (repeatable) names the runs instead (DIR holds benchmarks.json); `--plot`
also draws engine `ar` / transformers and `wedlm` / transformers per task and batch size, one bar
per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEMS = ("transformers", "ar", "verified")


def load(path: Path) -> dict[tuple[str, int], dict[str, dict]]:
    """{(task, batch): {system name: result row}} of one benchmarks.json."""
    out: dict[tuple[str, int], dict[str, dict]] = {}
    for r in json.loads(path.read_text())["results"]:
        out.setdefault((r["task"], r["batch_size"]), {})[r["system"]] = r
    return out


def wedlm_name(rows: dict[str, dict]) -> str | None:
    return next((name for name in rows if name.startswith("wedlm")), None)


def table(runs: dict[str, dict]) -> list[str]:
    """Markdown rows: one per (task, batch), columns per forward path."""
    modes = list(runs)
    head = ["task", "batch"]
    for m in modes:
        head += [f"{m}: transformers tok/s", f"{m}: ar tok/s", f"{m}: ar / transformers",
                 f"{m}: wedlm tok/s (tok/fwd)", f"{m}: verified tok/s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({k for r in runs.values() for k in r}, key=lambda k: (k[0], k[1]))
    for task, batch in keys:
        cells = [task, str(batch)]
        for m in modes:
            got = runs[m].get((task, batch), {})
            tf, ar, ver = (got.get(s, {}).get("tokens_per_s") for s in SYSTEMS)
            w = got.get(wedlm_name(got) or "", {})
            cells += [f"{tf:.0f}" if tf else "-", f"{ar:.0f}" if ar else "-",
                      f"{ar / tf:.2f}x" if ar and tf else "-",
                      f"{w['tokens_per_s']:.0f} ({w['tokens_per_forward']:.2f})" if w else "-",
                      f"{ver:.0f}" if ver else "-"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def plot(runs: dict[str, dict], path: Path) -> None:
    """Bars of engine `ar` / transformers and `wedlm` / transformers per (task, batch), one per run."""
    from wedlm.bench.plots import _plt

    plt = _plt()
    keys = sorted({k for r in runs.values() for k in r}, key=lambda k: (k[0], k[1]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=False)
    width = 0.8 / len(runs)
    for ax, what in zip(axes, ("ar", "wedlm")):
        for i, (label, res) in enumerate(runs.items()):
            ys = []
            for k in keys:
                got = res.get(k, {})
                name = wedlm_name(got) if what == "wedlm" else "ar"
                num, den = got.get(name or "", {}).get("tokens_per_s"), got.get("transformers", {}).get("tokens_per_s")
                ys.append(num / den if num and den else 0.0)
            ax.bar([j + i * width for j in range(len(keys))], ys, width, label=label, color=f"C{i}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(keys))])
        ax.set_xticklabels([f"{t}\nb={b}" for t, b in keys], fontsize=7)
        ax.set_ylabel(f"engine {what} / transformers generate (tokens/s)", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, nargs="?", help="a scripts/cpu_speed.sh folder (eager/, compiled/)")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=DIR", help="a named wedlm bench --out-dir")
    p.add_argument("--plot", type=Path, default=None, help="also write the ratio plot (PNG) here")
    args = p.parse_args(argv)
    if args.run:
        runs = {}
        for spec in args.run:
            label, sep, folder = spec.partition("=")
            if not sep or not (Path(folder) / "benchmarks.json").is_file():
                raise SystemExit(f"--run {spec!r}: expected LABEL=DIR with DIR/benchmarks.json")
            runs[label] = load(Path(folder) / "benchmarks.json")
    elif args.out is not None:
        runs = {m: load(args.out / m / "benchmarks.json") for m in ("eager", "compiled")
                if (args.out / m / "benchmarks.json").is_file()}
        if not runs:
            raise SystemExit(f"{args.out}: no eager/ or compiled/ benchmarks.json")
    else:
        raise SystemExit("give OUT or --run LABEL=DIR")
    print("\n".join(table(runs)))
    if args.plot:
        plot(runs, args.plot)
    times = args.out / "times.txt" if args.out is not None else None
    if times is not None and times.is_file():
        print("\nwall clock per part: " + "; ".join(times.read_text().split("\n")).strip("; "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
