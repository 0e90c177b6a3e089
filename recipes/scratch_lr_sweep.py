"""A learning-rate sweep of the from-scratch AR stage (docs/experiments.md, "A learning-rate sweep").

Each arm is configs/scratch_ar.yaml with one-row steps (`micro_batch: 1`), 200 warm-up steps,
a 12-minute clock-driven cosine down to lr/10, and the arm's peak learning rate; the arms run one
after another, each owning the CPU. `report` reads the arms' log.jsonl files and prints the AR loss
at fixed token counts (a markdown table) and plots loss against tokens.

    python -m wedlm.data.curriculum --out data/scratch/s1.jsonl --mix '{"seed": 40,
      "simple": {"6": 40000}, "simple_forms": {"6": 10000},
      "replay": {"count": 8000, "addsub": 20000, "listops": 20000}}'
    nohup python recipes/scratch_lr_sweep.py run --lrs 5e-4,3e-4,1e-3,2e-3,5e-3 > runs/lr-sweep.log 2>&1 &
    python recipes/scratch_lr_sweep.py report runs/scratch-lr-sweep/lr* --plot docs/img/scratch_ar_lr_sweep.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIG = "configs/scratch_ar.yaml"
ROOT = Path("runs/scratch-lr-sweep")
MARKS = (250_000, 500_000, 750_000, 1_000_000, 1_250_000, 1_500_000)
END_WINDOW = 100_000  # "end": the mean over the final 0.1M tokens of a run


def arm_overrides(lr: float, out_dir: Path, minutes: float = 12.0) -> list[str]:
    """The `--set` items of one arm: one-row steps, warm-up 200, cosine on the clock to lr/10."""
    return [f"lr={lr:.3e}", f"min_lr={lr / 10:.3e}", "micro_batch=1", "warmup_steps=200",
            f"max_minutes={minutes}", "save_every=400", "max_steps=40000", f"out_dir={out_dir}"]


def read_log(run: Path) -> list[dict]:
    """The training log rows of one arm (run/log.jsonl), in step order.

    Raises:
        FileNotFoundError: `run` is not a run folder (no log.jsonl in it).
    """
    if not (run / "log.jsonl").is_file():
        raise FileNotFoundError(f"{run}: not a training run folder (no log.jsonl)")
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["step"])


def loss_at(rows: list[dict], tokens: int, half_width: int = 100_000, key: str = "ar_loss") -> float | None:
    """Mean `key` of the logged steps whose token count is within `half_width` of `tokens`.

    Returns None where no logged step falls in the window (the arm stopped before `tokens`).
    """
    near = [r[key] for r in rows if abs(r["tokens"] - tokens) <= half_width]
    return sum(near) / len(near) if near else None


def rolling(values: list[float], n: int = 10) -> list[float]:
    """Trailing mean over the last `n` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


def summary(run: Path) -> dict:
    """One arm's row: peak lr, final step/tokens, steady tokens/s (after 120 s), the AR loss at
    MARKS (mean of the logged steps within 0.1M tokens) and over its last 0.1M tokens ("end";
    one-row steps make single logged losses noisy)."""
    rows = read_log(run)
    lr = json.loads((run / "train_config.json").read_text())["lr"]
    # the logged tok_s is the run's average so far (compile included); the steady rate is the
    # slope from the first row past 120 s to the last
    first = next((r for r in rows if r["elapsed_s"] > 120 and r is not rows[-1]), rows[0])
    span = rows[-1]["elapsed_s"] - first["elapsed_s"]
    steady = (rows[-1]["tokens"] - first["tokens"]) / span if span > 0 else rows[-1]["tok_s"]
    return {"run": str(run), "lr": lr, "steps": rows[-1]["step"], "tokens": rows[-1]["tokens"],
            "tok_s": steady, "minutes": rows[-1]["elapsed_s"] / 60,
            "end": loss_at(rows, rows[-1]["tokens"], END_WINDOW),
            "at": [loss_at(rows, m) for m in MARKS]}


def markdown(rows: list[dict]) -> str:
    head = "| run | peak lr | " + " | ".join(f"{m / 1e6:g}M" for m in MARKS) + " | steps | tokens | tokens/s | last 0.1M |"
    lines = [head, "|" + "---|" * (len(MARKS) + 6)]
    for s in sorted(rows, key=lambda s: (s["lr"], s["run"])):
        at = " | ".join("-" if v is None else f"{v:.3f}" for v in s["at"])
        lines.append(f"| {Path(s['run']).name} | {s['lr']:g} | {at} | {s['steps']:,} | {s['tokens'] / 1e6:.2f}M | "
                     f"{s['tok_s']:,.0f} | {s['end']:.3f} |")
    return "\n".join(lines)


def plot(runs: list[Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for run in sorted(runs, key=lambda r: (summary(r)["lr"], str(r))):
        rows = read_log(run)
        loss = rolling([r["ar_loss"] for r in rows])
        label = f"{run.name} (peak lr {summary(run)['lr']:g})"
        line, = ax_t.plot([r["tokens"] / 1e6 for r in rows], loss, label=label)
        ax_m.plot([r["elapsed_s"] / 60 for r in rows], loss, color=line.get_color())
    ax_t.set_yscale("log")
    ax_t.set_xlabel("tokens seen (millions)")
    ax_m.set_xlabel("minutes (compile included)")
    ax_t.set_ylabel("AR loss (mean of 10 logged steps)")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle("AR stage from scratch: 12 minutes per arm, one-row steps, 2-core CPU")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the arms one after another (skips finished ones)")
    r.add_argument("--lrs", default="5e-4,1e-3,2e-3,5e-3", help="comma-separated peak learning rates")
    r.add_argument("--minutes", type=float, default=12.0)
    r.add_argument("--root", type=Path, default=ROOT)
    p = sub.add_parser("report", help="table of AR loss at fixed token counts, and a plot")
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        for lr in (float(x) for x in args.lrs.split(",")):
            out = args.root / f"lr{lr:g}"
            if (out / "final" / "config.json").exists():
                continue
            cmd = [sys.executable, "-m", "wedlm.cli.main", "train", "--config", CONFIG]
            for item in arm_overrides(lr, out, args.minutes):
                cmd += ["--set", item]
            print("===", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        return 0
    print(markdown([summary(run) for run in args.runs]))
    if args.plot:
        plot(args.runs, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
