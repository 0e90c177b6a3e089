"""The benchmark figures, drawn with matplotlib's Agg backend (no display needed).

- speed vs tau: tokens/s of streaming decoding across the tau sweep, per task,
  with `ar` (dashed) and block-wise (crosses) for reference;
- accuracy vs speed: each system of a scored task as (speed-up vs ar, accuracy),
  the Pareto frontier drawn through the non-dominated points (paper Fig. 5a);
- p_cache by decoder: grouped bars, one group per task;
- decode trace: tokens committed at each step for one prompt, per decoder;
- speed-up over llama.cpp (`wedlm bench --peer llama.cpp`): grouped bars per task.
"""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (x, y) points (higher is better on both), sorted by x ascending."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(set(front))


def _colors(result: dict) -> dict[str, str]:
    """One matplotlib color per system, stable across all figures."""
    names = [s["name"] for s in result["systems"]]
    return {name: f"C{i % 10}" for i, name in enumerate(names)}


def _task_names(result):
    return list(dict.fromkeys(r["task"] for r in result["results"]))


def plot_speed_vs_tau(result: dict, path: Path, b: int) -> None:
    plt = _plt()
    lam = result["config"]["lambdas"][0]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, task in enumerate(_task_names(result)):
        color = f"C{i}"
        sweep = sorted((r["tau"], r["tokens_per_s"]) for r in result["results"] if r["task"] == task
                       and r["batch_size"] == b and r["decoding"] == "wedlm" and r["lam"] == lam)
        if sweep:
            ax.plot(*zip(*sweep), marker="o", color=color, label=f"{task}: wedlm")
        block = sorted((r["tau"], r["tokens_per_s"]) for r in result["results"] if r["task"] == task
                       and r["batch_size"] == b and r["decoding"] == "blockwise")
        if block:
            ax.scatter(*zip(*block), marker="x", color=color, label=f"{task}: blockwise")
        ar = [r["tokens_per_s"] for r in result["results"] if r["task"] == task and r["batch_size"] == b
              and r["system"] == "ar"]
        if ar:
            ax.axhline(ar[0], color=color, linestyle="--", linewidth=1)
    ax.set_xlabel("entropy threshold tau")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"Streaming decoding speed vs tau (batch {b}; dashed = ar)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accuracy_vs_speed(result: dict, path: Path, b: int) -> None:
    plt = _plt()
    scored = [t["name"] for t in result["tasks"] if t["scored"]]
    fig, axes = plt.subplots(1, max(1, len(scored)), figsize=(5.2 * max(1, len(scored)), 4.2), squeeze=False)
    colors = _colors(result)
    for ax, task in zip(axes[0], scored):
        pts = [(r["speedup_vs_ar"], 100 * r["accuracy"], r["system"]) for r in result["results"]
               if r["task"] == task and r["batch_size"] == b and r.get("speedup_vs_ar") and r["accuracy"] is not None]
        for x, y, name in pts:
            ax.scatter([x], [y], marker="o" if name.startswith("wedlm") else "s", color=colors[name],
                       label=name, zorder=3)
        front = pareto_front([(x, y) for x, y, _ in pts])
        if front:
            ax.plot(*zip(*front), color="k", linewidth=1, linestyle=":", label="Pareto frontier")
        ax.legend(fontsize=6)
        ax.set_ylim(-5, 105)
        ax.set_xlabel("speed-up vs ar (tok/s ratio)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{task} (batch {b})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_p_cache(result: dict, path: Path, b: int) -> None:
    plt = _plt()
    tasks = _task_names(result)
    systems = list(dict.fromkeys(r["system"] for r in result["results"]))
    width = 0.8 / max(1, len(systems))
    colors = _colors(result)
    fig, ax = plt.subplots(figsize=(max(6.4, 1.6 * len(tasks) + 0.3 * len(systems)), 4.8))
    for j, name in enumerate(systems):
        values = []
        for task in tasks:
            hit = [r["p_cache"] for r in result["results"] if r["task"] == task and r["batch_size"] == b
                   and r["system"] == name]
            values.append(hit[0] if hit else 0.0)
        ax.bar([i + j * width for i in range(len(tasks))], values, width, label=name, color=colors.get(name))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks)
    ax.set_ylabel("p_cache (Eq. 4)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Prefix cacheability by decoder (batch {b})")
    ax.legend(fontsize=6, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_trace(result: dict, path: Path) -> None:
    plt = _plt()
    trace = result.get("trace") or {"commits": {}, "prompt": "", "task": ""}
    colors = _colors(result)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.2, 5.6), sharex=True)
    for name, commits in trace["commits"].items():
        if not commits:
            continue
        steps = range(1, len(commits) + 1)
        top.step(steps, commits, where="mid", label=f"{name} ({len(commits)} steps)", linewidth=1,
                 color=colors.get(name))
        total, cum = 0, []
        for c in commits:
            total += c
            cum.append(total)
        bottom.plot(steps, cum, linewidth=1, color=colors.get(name))
    top.set_ylabel("tokens committed")
    top.set_title(f"Decode trace: {trace['prompt']!r}", fontsize=9)
    top.legend(fontsize=6)
    bottom.set_ylabel("tokens generated")
    bottom.set_xlabel("decode step (forward)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_peer(result: dict, path: Path) -> None:
    """Speed-up over llama.cpp AR (whole-answer wall clock) per task: one bar per engine system,
    llama.cpp as the dashed line at 1 (`wedlm bench --peer llama.cpp`)."""
    plt = _plt()
    tasks = list(dict.fromkeys(r["task"] for r in result["results"]))
    systems = [s for s in dict.fromkeys(r["system"] for r in result["results"]) if s != "llama.cpp"]
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(6.4, 1.8 * len(tasks) + 0.3 * len(systems)), 4.2))
    for j, name in enumerate(systems):
        values = [next(r["speedup_vs_llama_cpp"] for r in result["results"] if r["task"] == t and r["system"] == name)
                  for t in tasks]
        ax.bar([i + j * width for i in range(len(tasks))], values, width, label=name, color=f"C{j % 10}")
    ax.axhline(1.0, color="k", linestyle="--", linewidth=1, label="llama.cpp AR")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks)
    ax.set_ylabel("speed-up over llama.cpp (wall clock)")
    ax.set_title(f"Batch 1, {result['config']['threads']} thread(s), same weights (llama.cpp {result['llama_cpp']})")
    # below the axes: inside them it covered the tallest bars
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(result: dict, img_dir: Path) -> dict[str, Path]:
    """All four PNGs into `img_dir`; returns {plot name: path}."""
    img_dir.mkdir(parents=True, exist_ok=True)
    sizes = result["config"]["batch_sizes"]
    b1, bmax = min(sizes), max(sizes)
    paths = {name: img_dir / f"bench_{name}.png" for name in ("speed_vs_tau", "accuracy_vs_speed", "p_cache", "trace")}
    plot_speed_vs_tau(result, paths["speed_vs_tau"], b1)
    plot_accuracy_vs_speed(result, paths["accuracy_vs_speed"], bmax)
    plot_p_cache(result, paths["p_cache"], b1)
    plot_trace(result, paths["trace"])
    return paths
