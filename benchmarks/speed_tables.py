"""Markdown tables of a `scripts/speed_session.sh` folder: engine vs transformers, eager vs compiled.

    python benchmarks/speed_tables.py OUT

Reads OUT/eager/benchmarks.json and OUT/compiled/benchmarks.json (two `wedlm bench` runs of
the session) and prints, per task and batch size, tokens/s of transformers `generate`, engine
`ar`, `wedlm` and `verified`, and engine `ar` / transformers within each run (the ratio the
speed targets are stated in; each run has its own transformers column, so load drifts between
the runs cancel in the ratios). Then OUT/times.txt (wall clock of each part) when present.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    runs = {m: load(args.out / m / "benchmarks.json") for m in ("eager", "compiled")
            if (args.out / m / "benchmarks.json").is_file()}
    if not runs:
        raise SystemExit(f"{args.out}: no eager/ or compiled/ benchmarks.json")
    print("\n".join(table(runs)))
    times = args.out / "times.txt"
    if times.is_file():
        print("\nwall clock per part: " + "; ".join(times.read_text().split("\n")).strip("; "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
