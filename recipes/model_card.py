"""Write models/wedlm-tiny/README.md (the model card) from the recipe's logs and the evaluation.

    python recipes/model_card.py --run runs/wedlm-tiny --eval runs/wedlm-tiny/eval/summary.json

Reads stages.jsonl (wall clock per stage), each stage's log.jsonl, train_config.json and
final/config.json (steps, tokens, tokens/s, precision path, final losses), the curriculum data
(records and tokens per task), the decoding tuning (tune.json) and the evaluation summary
written by recipes/eval_wedlm_tiny.py, so every number in the card comes from a file. Copies
the probe plots and draws the learning curves into models/wedlm-tiny/plots/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STAGES = [("ar", "AR training from scratch (next-token loss on answers)", "configs/tiny_ar.yaml"),
          ("wedlm", "WeDLM training (dual-stream masking + AR loss, 8 learnable `<|im_end|>`)",
           "configs/tiny_wedlm.yaml"),
          ("wedlm-cont", "continued WeDLM training (unseen records, less counting; `CONTINUE=1`)",
           "configs/tiny_wedlm_cont.yaml"),
          ("wedlm-simple", "WeDLM training on 1-6-term \"Count from A to B.\" records (reads B; `V4=1`)",
           "configs/tiny_wedlm_simple.yaml"),
          ("wedlm-mix", "WeDLM training on a mix keeping those records, every task back (`V4=1`)",
           "configs/tiny_wedlm_mix.yaml"),
          ("wedlm-forms", "WeDLM training on more arithmetic and list operations, short ranges of every "
           "counting form (`V4=1`)", "configs/tiny_wedlm_forms.yaml"),
          ("wedlm-tens10", "WeDLM training on steps of 10 alone, the stop weighted 20x (`V5=1`)",
           "configs/tiny_wedlm_tens10.yaml"),
          ("wedlm-tens", "last-digit distractor ranges of every form + all tasks, both stops weighted (`V5=1`)",
           "configs/tiny_wedlm_tens.yaml"),
          ("wedlm-tens2", "mostly distractor ranges, lr 1e-3 (`V5=1`)", "configs/tiny_wedlm_tens2.yaml"),
          ("wedlm-tens3", "distractor + short ranges + all tasks, mask-stream stop weighted 20x (`V5=1`)",
           "configs/tiny_wedlm_tens3.yaml"),
          ("wedlm-tens5", "suffix masking in half of the blocks, mask-stream stop 40x (`V6=1`)",
           "configs/tiny_wedlm_tens5.yaml"),
          ("wedlm-tens6", "more of the same on unseen records, lr 5e-4 (`V6=1`)", "configs/tiny_wedlm_tens6.yaml"),
          ("wedlm-tens7", "short ranges of every form doubled, lr 3e-4 (`V6=1`)", "configs/tiny_wedlm_tens7.yaml"),
          ("wedlm-deep", "grown to 8 layers (new layers start as identities), the version 6 mix on unseen "
           "records, bf16 (`V7=1`)", "configs/tiny_wedlm_deep.yaml"),
          ("wedlm-deep2", "more of the same on unseen records (`V7=1`)", "configs/tiny_wedlm_deep2.yaml"),
          ("wedlm-deep3", "more of the same on unseen records (`V8=1`)", "configs/tiny_wedlm_deep3.yaml"),
          ("wedlm-deep4", "more of the same on unseen records (`V8=1`)", "configs/tiny_wedlm_deep4.yaml"),
          ("wedlm-deep5", "the leftmost mask of each block weighted 4x (`first_mask_weight`, `V8=1`)",
           "configs/tiny_wedlm_deep5.yaml"),
          ("wedlm-deep11", "version 8 continued: two-digit distractor ranges, AR stop weight 20x -> 1x "
           "(`V9=1`)", "configs/tiny_wedlm_deep11.yaml"),
          ("wedlm-deep12", "sums and differences next to a change in their digit count added, half the "
           "learning rate (`V9=1`)", "configs/tiny_wedlm_deep12.yaml"),
          ("wedlm-deep13", "version 9 continued: more two-digit distractor ranges, carry sums and arithmetic, "
           "compiled (`V10=1`)", "configs/tiny_wedlm_deep13.yaml"),
          ("wedlm-deep14", "the mask stream's end weight 40x -> 8x (`V10=1`)", "configs/tiny_wedlm_deep14.yaml"),
          ("wedlm-deep17", "version 10 continued with random block offsets (`random_block_offset`, `V11=1`)",
           "configs/tiny_wedlm_deep17.yaml")]


def stages_run(run: Path) -> list[tuple[str, str, str]]:
    """The STAGES trained in `run`: final checkpoint and log.jsonl (a folder holding only an
    exported checkpoint, e.g. shipped weights copied in as the next stage's init, does not count)."""
    return [s for s in STAGES if (run / s[0] / "final" / "config.json").is_file() and (run / s[0] / "log.jsonl").is_file()]


def carried_rows(card: Path) -> dict[str, dict]:
    """Training-table rows of an earlier card, by stage name: {"row", "tokens", "minutes"}.

    A stage trained in an earlier session whose `runs/` folder is gone keeps its row (steps,
    tokens, clock, tokens/s, precision, losses) from the card it was first reported in; the
    conversion row comes back under "convert". Empty when `card` does not exist.
    """
    if not card.is_file():
        return {}
    import re

    by_cfg = {cfg: name for name, _, cfg in STAGES}
    out: dict[str, dict] = {}
    for line in card.read_text().splitlines():  # titles hold `<|im_end|>`: match cells, do not split on |
        if line.startswith("| conversion") and (m := re.search(r"\| (\d+) s \|", line)):
            out["convert"] = {"row": line, "tokens": 0.0, "minutes": int(m.group(1)) / 60}
            continue
        cfg = re.search(r"\| `(configs/[\w.-]+\.yaml)` \|", line)
        tokens = re.search(r"\| ([\d.]+)M \| ([\d.]+) min \|", line)
        if line.startswith("| ") and cfg and tokens and cfg.group(1) in by_cfg:
            out[by_cfg[cfg.group(1)]] = {"row": line, "tokens": float(tokens.group(1)) * 1e6,
                                         "minutes": float(tokens.group(2))}
    return out


def carried_cpu(card: Path) -> str | None:
    """The "CPU: ..." of an earlier card (the processor its first stage run in that session
    trained on), for a card regenerated with no stage logs here; None when absent."""
    import re

    found = re.search(r"^CPU: (.+?)\. In version 2", card.read_text(), re.M) if card.is_file() else None
    return found.group(1) if found else None


def stage_names(run: Path, carried: dict[str, dict]) -> list[str]:
    """Stages of the shipped weights in recipe order: run here, or carried from the earlier card.

    A carried stage counts only when it comes before every stage run here (the lineage is a chain).
    """
    here = {name for name, _, _ in stages_run(run)}
    first = min((i for i, (name, _, _) in enumerate(STAGES) if name in here), default=len(STAGES))
    return [name for i, (name, _, _) in enumerate(STAGES) if name in here or (i < first and name in carried)]


def read_log(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def stage_rows(run: Path, carried: dict[str, dict] | None = None) -> tuple[list[str], dict]:
    """Markdown rows of the training table and totals {minutes, tokens}.

    Stages without a folder in `run` take their row from `carried` (see `carried_rows`).
    """
    from wedlm.train.trainer import final_losses  # what the trainer records in final/config.json

    carried = carried or {}
    seconds: dict[str, float] = {}
    stages_file = run / "stages.jsonl"
    for line in (stages_file.read_text().splitlines() if stages_file.is_file() else []):
        rec = json.loads(line)
        seconds[rec["stage"]] = seconds.get(rec["stage"], 0) + rec["seconds"]
    rows = ["| stage | config | steps | tokens (clean) | training clock | tokens/s (mean) | precision | "
            "final losses (mean of last 5 logged steps) |", "|---|---|---|---|---|---|---|---|"]
    total_tokens = 0
    here = {name for name, _, _ in stages_run(run)}
    names = stage_names(run, carried)
    for name, title, cfg in STAGES:
        if name not in names:
            continue
        if name not in here:
            rows.append(carried[name]["row"])
            total_tokens += carried[name]["tokens"]
            seconds[name] = carried[name]["minutes"] * 60
            continue
        meta = json.loads((run / name / "final" / "config.json").read_text()).get("wedlm_training", {})
        tail = final_losses(run / name / "log.jsonl")
        losses = f"AR {tail['ar_loss']:.3f}" + (f", mask {tail['mask_loss']:.3f}" if name != "ar" else "")
        clock = meta["elapsed_s"]
        total_tokens += meta["tokens"]
        seconds[name] = clock
        precision = "bf16 autocast" if meta.get("precision") == "bf16" else "fp32"
        rows.append(f"| {title} | `{cfg}` | {meta['steps']} | {meta['tokens'] / 1e6:.2f}M | {clock / 60:.1f} min | "
                    f"{meta['tokens'] / max(1, clock):,.0f} | {precision} | {losses} |")
    if "convert" not in seconds and "convert" in carried:
        seconds["convert"] = carried["convert"]["minutes"] * 60
    rows.append(f"| conversion (`wedlm convert`) | - | - | - | {seconds.get('convert', 0):.0f} s | - | - | - |")
    total = sum(v for k, v in seconds.items() if k in {name for name, _, _ in STAGES} | {"convert"})
    rows.append(f"| **total** | | | **{total_tokens / 1e6:.2f}M** | **{total / 60:.1f} min** | | | |")
    return rows, {"minutes": total / 60, "tokens": total_tokens}


def learning_curves(run: Path, out: Path, offset: float = 0.0) -> str:
    """plots/learning_curves.png: AR and mask losses against clean tokens seen, every stage in `run`.

    `offset` (clean tokens) is what earlier stages without logs here had seen; the x axis starts there.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, _, _ in stages_run(run):
        log = read_log(run / name / "log.jsonl")
        xs = [(offset + r["tokens"]) / 1e6 for r in log]
        ax.plot(xs, [r["ar_loss"] for r in log], label=f"{name}: AR loss", lw=1)
        if name != "ar":
            ax.plot(xs, [r["mask_loss"] for r in log], label=f"{name}: mask loss (1/gamma-weighted)", lw=1)
        offset += log[-1]["tokens"]
        ax.axvline(offset / 1e6, color="grey", ls=":", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("clean tokens seen (millions)")
    ax.set_ylabel("loss (nats)")
    ax.set_title("wedlm-tiny learning curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=120)
    plt.close(fig)
    return "learning_curves.png"


def data_rows(cfg_path: Path) -> list[str]:
    """Records and answer tokens per task of the records a stage reads (skip, limit, source caps)."""
    import yaml

    from wedlm.tokenizer import load_tokenizer
    from wedlm.train.data import select_records

    cfg = yaml.safe_load(cfg_path.read_text())
    recs = select_records(REPO / cfg["data"], cfg.get("data_limit"), cfg.get("data_skip", 0),
                          cfg.get("source_limits"))
    tok = load_tokenizer(REPO / cfg["tokenizer"])
    per: dict[str, list] = {}
    for r in recs:
        per.setdefault(r["source"], []).append(r["messages"][-1]["content"])
    rows = ["| task | records | answer tokens | share of answer tokens |", "|---|---|---|---|"]
    counts = {t: sum(len(e.ids) for e in tok.backend_tokenizer.encode_batch(a, add_special_tokens=False))
              for t, a in per.items()}
    total = sum(counts.values())
    for t in sorted(per):
        rows.append(f"| {t} | {len(per[t]):,} | {counts[t] / 1e6:.2f}M | {100 * counts[t] / total:.0f}% |")
    return rows


def config_rows(*names: str) -> dict[str, str]:
    """{name: the data table of configs/tiny_wedlm_{name}.yaml} for the DATA_V* templates."""
    return {k: "\n".join(data_rows(REPO / "configs" / f"tiny_wedlm_{k}.yaml")) for k in names}


def mix_section(flag: str, *names: str) -> str:
    """The data section of recipe stages that each read the mix written by their config header's
    `--mix` command: one table per configs/tiny_wedlm_{name}.yaml, in order."""
    tables = config_rows(*names)
    parts = [f"{'and ' if i and i == len(names) - 1 else ''}`configs/tiny_wedlm_{name}.yaml`:\n\n{tables[name]}"
             for i, name in enumerate(names)]
    reads = ("stage reads the mix written by the `--mix` command in the header of" if len(names) == 1 else
             "stages read the mixes written by the `--mix` commands in the headers of")
    return f"\nThe `{flag}=1` {reads}\n" + "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    from recipes.eval_wedlm_tiny import markdown  # noqa: E402  (script module next to this one)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default=str(REPO / "runs" / "wedlm-tiny"))
    p.add_argument("--eval", default=str(REPO / "runs" / "wedlm-tiny" / "eval" / "summary.json"))
    p.add_argument("--tune", default=str(REPO / "runs" / "wedlm-tiny" / "tune.json"))
    p.add_argument("--model", default=str(REPO / "models" / "wedlm-tiny"))
    p.add_argument("--notes", default=None, help="markdown file appended as 'Findings'")
    args = p.parse_args(argv)
    run, model = Path(args.run), Path(args.model)
    cfg = json.loads((model / "config.json").read_text())
    gen = json.loads((model / "generation_config.json").read_text())
    summary = json.loads(Path(args.eval).read_text())
    tune = json.loads(Path(args.tune).read_text()) if Path(args.tune).is_file() else None
    plots = model / "plots"
    plots.mkdir(exist_ok=True)
    for name in summary.get("plots", []):
        shutil.copyfile(Path(args.eval).parent / name, plots / name)
    carried = carried_rows(model / "README.md")
    names = set(stage_names(run, carried))
    here = [name for name, _, _ in stages_run(run)]
    missing = [name for name, _, _ in STAGES if name in names and name not in here]
    earlier_curves = ""
    if missing:  # earlier stages' logs are gone: keep their curves as drawn in the earlier card
        kept = plots / f"learning_curves_{missing[0]}-{missing[-1]}.png"
        if here and (plots / "learning_curves.png").is_file() and not kept.is_file():
            shutil.copyfile(plots / "learning_curves.png", kept)
        if kept.is_file() or not here:  # each earlier card's curves, oldest first (each shows the stages its session ran)
            def last_stage(f: Path) -> int:  # learning_curves_FIRST-LAST.png: LAST's place in STAGES
                return max((i for i, (n, _, _) in enumerate(STAGES) if f.stem.endswith(n)), default=-1)
            shown = sorted(plots.glob("learning_curves_*-*.png"), key=lambda f: (last_stage(f), f.name))
            earlier_curves = (f"\n\nStages {', '.join(missing)} (trained in earlier sessions; rows and curves "
                              f"carried from the cards of those versions):" + "".join(
                                  f"\n\n![learning curves kept from an earlier card ({f.name})]"
                                  f"(plots/{f.name})" for f in shown))
    if here:  # with no stage logs here (a card regenerated after a new evaluation only), the curves stay
        learning_curves(run, plots, offset=sum(carried[name]["tokens"] for name in missing))
    from wedlm.model import load_model
    n_params = sum(p.numel() for p in load_model(model).parameters())
    size_mb = sum(f.stat().st_size for f in model.rglob("*") if f.is_file()) / 1e6
    stages, totals = stage_rows(run, carried)
    continued = "wedlm-cont" in names
    v4 = "wedlm-mix" in names
    v5 = "wedlm-tens3" in names
    v6 = "wedlm-tens7" in names
    v7 = "wedlm-deep" in names
    v8 = [n for n in ("deep3", "deep4", "deep5") if f"wedlm-{n}" in names]
    v9 = "wedlm-deep12" in names
    v10 = "wedlm-deep14" in names
    v11 = "wedlm-deep17" in names
    train_cfg = (json.loads((run / here[0] / "train_config.json").read_text()) if here
                 else {"cpu": carried_cpu(model / "README.md")})
    tune_line = "not run"
    if tune and not tune.get("best"):
        tune_line = (f"{len(tune['grid'])} settings on the validation split "
                     f"({', '.join(f'{k} {v}' for k, v in tune['n'].items())} items); none kept every task within "
                     f"{100 * tune['slack']:.1f} points of AR, so the defaults stayed at W=16, tau=0.4, lambda=0.02 "
                     f"(the grid is in runs/wedlm-tiny/tune.json)")
    if tune and tune.get("best"):
        b = tune["best"]
        within = (f"every task within {100 * tune['slack']:.1f} points of AR" if tune.get("rule") != "closest to AR"
                  else f"no setting kept every task within {100 * tune['slack']:.1f} points of AR, so the pick is the "
                       f"one closest to AR (its worst task {100 * b['worst_loss']:.1f} points below AR on validation"
                       + (f"; worst-task losses within {100 * tune['tie']:.1f} points of the smallest count as equal "
                          f"(by default one item of the smallest task), the fastest of those wins" if tune.get("tie") else "") + ")")
        tune_line = (f"{len(tune['grid'])} settings on the validation split ({', '.join(f'{k} {v}' for k, v in tune['n'].items())}"
                     f" items); picked W={b['window']}, tau={b['tau']}, lambda={b['lambda']}"
                     + (f", stop_by_ar={str(b['stop_by_ar']).lower()}" if "stop_by_ar" in b else "")
                     + (", stop_in_run=true" if b.get("stop_in_run") else "") + ": "
                     f"{b['tokens_per_forward']:.2f} tokens/forward; {within}")
    tune_cmd = "python recipes/tune_decoding.py --write"
    if tune:  # the command that wrote tune.json, rebuilt from what it records
        fmt = lambda xs: ",".join(f"{x:g}" for x in sorted(set(xs)))  # noqa: E731
        pairs = list(dict.fromkeys(f"{g['tau']:g}:{g['lambda']:g}" for g in tune["grid"]))  # in the order run
        stops = list(dict.fromkeys("run" if g.get("stop_in_run") else str(int(g["stop_by_ar"]))
                                   for g in tune["grid"] if "stop_by_ar" in g))
        tune_cmd += (f" --n {','.join(f'{k}={v}' for k, v in tune['n'].items())}"
                     f" --windows {fmt(g['window'] for g in tune['grid'])} --pairs {','.join(pairs)}"
                     + (f" --stop-by-ar {','.join(stops)}" if stops else ""))
    probe = summary.get("mask_probe", {})
    probe_rows = ["| task | AR head next-token acc | mask acc d=0 | d=3 | d=7 | d=15 | accepted fills | accepted right "
                  "| end slot right, k = 0 / 1 / 2 / 3 answer tokens masked before it |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for task, r in probe.items():
        acc = r["slot_accuracy"]
        pick = [acc[d] if d < len(acc) and acc[d] is not None else float("nan") for d in (0, 3, 7, 15)]
        right = r["accepted_right"]
        ends = r.get("end_accuracy") or []
        end_cell = " / ".join("-" if k >= len(ends) or ends[k] is None else f"{ends[k]:.2f}" for k in range(4))
        probe_rows.append(f"| {task} | {r['ar_accuracy']:.4f} | " + " | ".join(f"{a:.3f}" for a in pick)
                          + f" | {r['accepted']:,} | {'-' if right is None else f'{100 * right:.2f}%'} | {end_cell} |")
    end_rows = ""
    if summary.get("end_probe"):
        rows = ["| task | items | p(end) where the answer ends (median) | largest p(end) earlier (median) | "
                "ends exactly there |", "|---|---|---|---|---|"]
        for task, r in summary["end_probe"].items():
            rows.append(f"| {task} | {r['n']} | {r['p_end_at_end_median']:.3f} | {r['p_end_early_max_median']:.3f} | "
                        f"{100 * r['decided_right']:.0f}% |")
        end_rows = END_PROBE.format(rows="\n".join(rows))
    card = TEMPLATE.format(
        params=f"{n_params / 1e6:.2f}M", size=f"{size_mb:.1f}", **{k: cfg[k] for k in (
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "max_position_embeddings", "mask_token_id")},
        window=gen["wedlm_window_size"], tau=gen["wedlm_entropy_threshold"], lam=gen["wedlm_pos_penalty_factor"],
        stop_by_ar=(", stops decided by the AR head (`wedlm_stop_by_ar: true`: the leftmost mask is filled from the "
                    + ("AR head, and another mask may take a stop token only when every mask to its left is filled "
                       "in the same forward: `wedlm_stop_in_run: true`)" if gen.get("wedlm_stop_in_run") else
                       "AR head and no other mask may take a stop token)") if gen.get("wedlm_stop_by_ar") else ""),
        data="\n".join(data_rows(REPO / "configs" / "tiny_wedlm.yaml")), stages="\n".join(stages),
        data_cont=(DATA_CONT.format(rows="\n".join(data_rows(REPO / "configs" / "tiny_wedlm_cont.yaml")))
                   if continued else "") + (DATA_V4.format(
                       simple="\n".join(data_rows(REPO / "configs" / "tiny_wedlm_simple.yaml")),
                       mix="\n".join(data_rows(REPO / "configs" / "tiny_wedlm_mix.yaml")),
                       forms=DATA_FORMS.format(rows="\n".join(data_rows(REPO / "configs" / "tiny_wedlm_forms.yaml")))
                       if "wedlm-forms" in names else "") if v4 else "") + (DATA_V5.format(**config_rows("tens10", "tens", "tens2", "tens3"))
                                          if v5 else "") + (mix_section("V6", "tens5", "tens6", "tens7")
                                                            if v6 else "")
        + (mix_section("V7", "deep", "deep2") if v7 else "") + (mix_section("V8", *v8) if v8 else "")
        + (mix_section("V9", "deep11", "deep12") if v9 else "") + (mix_section("V10", "deep13", "deep14") if v10 else "")
        + (mix_section("V11", "deep17") if v11 else ""),
        can_do=CAN_DO_V6 if v6 else CAN_DO_V5 if v5 else CAN_DO_V4 if v4 else CAN_DO_V3,
        lineage=lineage_v11(totals["minutes"], v8) if v11 else lineage_v10(totals["minutes"], v8) if v10 else lineage_v9(totals["minutes"], v8) if v9 else lineage_v8(v8, totals["minutes"]) if v8 else LINEAGE_V7 if v7 else LINEAGE_V6 if v6 else LINEAGE_V5 if v5 else LINEAGE_V4.format(
            forms=(", and a third at a lower learning rate with more arithmetic and list operations and "
                   "short ranges of every counting form" if "wedlm-forms" in names else ""),
            v4_stages="5, 6 and 7" if "wedlm-forms" in names else "5 and 6") if v4 else LINEAGE_V3 if continued else LINEAGE_V2,
        cont_cpu=(" The continued stages had the machine to itself, on 2 threads." if continued else ""),
        recipe_minutes="" if not continued else (" (the 118-minute recipe plus continued stages)" if v4 else
                                                 " (the 118-minute recipe plus a continued stage)"),
        minutes=f"{totals['minutes']:.0f}", tokens=f"{totals['tokens'] / 1e6:.1f}M",
        eval_args=" ".join(f"--n-{t} {summary['tasks_total']['ar'][t]['n']}" for t in ("count", "addsub", "listops")
                           if t in summary.get("tasks_total", {}).get("ar", {})) + " --probe-items 20",
        cpu=train_cfg.get("cpu") or "CUDA", tune=tune_line, tune_cmd=tune_cmd, eval_table=markdown(summary),
        earlier_curves=earlier_curves, eval_precision=summary.get("precision", "float32 weights"), probe="\n".join(probe_rows), end_probe=end_rows, verified_diff=summary.get("verified_differs_from_ar", "n/a"),
        notes=Path(args.notes).read_text() if args.notes else "")
    (model / "README.md").write_text(card)
    print(f"wrote {model / 'README.md'}")
    return 0


CAN_DO_V3 = """What it can do: count (up or down, steps 1/2/5/10, from anywhere in 0..1100; from a random
start it seldom stops at the requested end yet, see the evaluation), add and subtract
two-digit numbers, and copy / reverse / sort / insert / remove / replace items of short name
lists, answering in the ChatML chat format. What it shows: on these answers streaming
parallel decoding (`wedlm`) commits several tokens per forward; how close its answers stay to
AR decoding's is measured below on items it never saw."""

CAN_DO_V4 = """What it can do: count (up or down, steps 1/2/5/10, from anywhere in 0..1100; it stops at
the requested end of short ranges counting up, and less often on ranges counting down, with
steps or longer than about ten numbers: see the evaluation and the end probe), add and
subtract two-digit numbers, and copy / reverse / sort / insert / remove / replace items of
short name lists, answering in the ChatML chat format. What it shows: on these answers
streaming parallel decoding (`wedlm`) commits several tokens per forward; how close its
answers stay to AR decoding's is measured below on items it never saw."""

CAN_DO_V5 = """What it can do: count (up or down, steps 1/2/5/10, from anywhere in 0..1100; it stops at
the requested end more often than not with `ar` on ranges of up to about 20 numbers, less on
longer ranges, and less under `wedlm`: see the evaluation and the end probe), add and
subtract two-digit numbers, and copy / reverse / sort / insert / remove / replace items of
short name lists, answering in the ChatML chat format. What it shows: on these answers
streaming parallel decoding (`wedlm`) commits several tokens per forward; how close its
answers stay to AR decoding's is measured below on items it never saw."""

CAN_DO_V6 = """What it can do: count (up or down, steps 1/2/5/10, from anywhere in 0..1100; it stops at
the requested end of most ranges, with `ar` and, since version 6, nearly as often with `wedlm`:
see the evaluation and the end probe), add and subtract two-digit numbers, and copy / reverse /
sort / insert / remove / replace items of short name lists, answering in the ChatML chat format.
What it shows: on these answers streaming parallel decoding (`wedlm`) commits several tokens
per forward; how close its answers stay to AR decoding's is measured below on items it never
saw."""

LINEAGE_V5 = """This is version 5 of the shipped weights (version 4 was never shipped: its recipe path
`V4=1` ends in a model that stops at the first value ending in B's last digit). Version 1 (a 2.4M
model of the same shape trained on synthetic text, CPython stdlib code and chat SFT on a shared,
slowed machine) scored near 0% on held-out counting and arithmetic. Version 2 was retrained from
scratch (same tokenizer, same shape) with the official mask count per block (`round(gamma * n)`,
none when 0), 8 learnable `<|im_end|>` after every answer, and the curriculum below (stages 1-3 of
the recipe); version 3 continued it with a fourth stage on unseen records. Version 3 counted right
from any start but did not read the end value B from the prompt. Version 5 continues version 3
with the `V4=1` stages (1-6-term "Count from A to B." records, then mixes that bring every task
back: the model reads B, but compares only B's last digit with the number it just wrote) and the
`V5=1` stages: "Count from A to B in steps of 10." alone with the AR loss of the stop weighted 20x
(`end_weight`), where after ~600 steps the model learns to compare the tens digit too, then mixes
of ranges in which an earlier value ends like B, with both the AR and the mask stream's end
targets weighted (`end_weight`, `mask_end_weight`; docs/training.md, "The last-digit shortcut").
The older versions are in git history. `V5=1 bash recipes/wedlm_tiny.sh` reproduces version 5 from
an empty `runs/` folder (about 400 minutes on 2 quiet cores)."""

DATA_V5 = """
The `V5=1` stages read: steps of 10 alone (`configs/tiny_wedlm_tens10.yaml`, the file its header
writes):

{tens10}

then the three mixes written by the `--mix` commands in the headers of
`configs/tiny_wedlm_tens.yaml`:

{tens}

`configs/tiny_wedlm_tens2.yaml`:

{tens2}

and `configs/tiny_wedlm_tens3.yaml`:

{tens3}
"""

LINEAGE_V6 = """This is version 6 of the shipped weights: version 5 (below) continued for three stages with
suffix masking (`suffix_mask_prob: 0.5`, docs/training.md, "Suffix masking: version 6"). In half of the
prediction-stream blocks the masked tokens are the block's LAST round(gamma * n) tokens instead of
a random subset: the shape streaming decoding shows its leftmost mask (the committed prefix and
nothing to its right), which the paper's random draw seldom trains. Same counts,
same 1/gamma weights; not in the paper. Version 5 (version 4 was never shipped) continued version
3 with the `V4=1` stages (1-6-term "Count from A to B." records, then mixes that bring every task
back) and the `V5=1` stages (steps of 10 alone with the AR stop weighted 20x, then mixes of ranges
in which an earlier value ends like B, with both the AR and the mask stream's end targets
weighted). Version 3 was a 2.4M model trained from scratch on the curriculum with the official
mask count per block and 8 learnable `<|im_end|>` after every answer, then continued once;
version 1 (trained on synthetic text, code and chat on a shared, slowed machine) scored near 0%
on held-out counting and arithmetic. The older versions are in git history.
`V6=1 bash recipes/wedlm_tiny.sh` reproduces version 6 from an empty `runs/` folder (about 460
minutes on 2 quiet cores)."""

LINEAGE_V7 = """This is version 7 of the shipped weights: version 6 grown from 4 to 8 layers (`python -m
wedlm.train.grow`: every layer is followed by a copy of itself whose attention output and MLP down
projections are zero, so the grown model starts with version 6's logits), then trained for two
stages on unseen records of version 6's last mix (bf16 autocast on a CPU with AMX). Version 6
continued version 5 for three stages with suffix masking (`suffix_mask_prob: 0.5`, docs/training.md,
"Suffix masking: version 6"): in half of the prediction-stream blocks the masked tokens are the
block's LAST round(gamma * n) tokens instead of a random subset, the shape streaming decoding shows
its leftmost mask, which the paper's random draw seldom trains (same counts, same 1/gamma weights;
not in the paper). Version 5 (version 4 was never shipped) continued version 3 with stages that
teach reading the end value B from the prompt and stopping there (1-6-term ranges, steps of 10
alone with the AR stop weighted 20x, ranges in which an earlier value ends like B, both the AR and
the mask stream's end targets weighted). Version 3 was a 2.4M model trained from scratch on the
curriculum with the official mask count per block and 8 learnable `<|im_end|>` after every answer,
then continued once; version 1 (trained on synthetic text, code and chat on a shared, slowed
machine) scored near 0% on held-out counting and arithmetic. The older versions are in git
history. `V7=1 bash recipes/wedlm_tiny.sh` reproduces version 7 from an empty `runs/` folder (about
540 minutes on 2 quiet cores)."""

def reproduces(version: int, minutes: float) -> str:
    """The closing sentence of a lineage: the recipe flag that rebuilds `version` from nothing and
    the whole lineage's training clock (`minutes`, the card's total row)."""
    return (f"`V{version}=1 bash recipes/wedlm_tiny.sh` reproduces version {version} from an empty `runs/` "
            f"folder (about {minutes:.0f} minutes on 2 quiet cores).")


def v8_account(stages: list[str]) -> str:
    """What version 8 is, from "version 7 trained for ..." to "... are in git history.": version 7
    continued by the `V8=1` stages in `stages` (names without the "wedlm-" prefix), then LINEAGE_V7's
    account of the versions before it. Shared by the lineages of version 8 and of version 9."""
    first = ("; the last weights each block's leftmost masked token 4x in the mask loss "
             "(`first_mask_weight: 4`: the distance-0 prediction streaming decoding makes at window slot 0; "
             "not in the paper)") if "deep5" in stages else ""
    before = LINEAGE_V7.split("history.")[0].replace("This is version 7 of the shipped weights: version 6",
                                                      "Version 7 was version 6")
    more = "1 more stage" if len(stages) == 1 else f"{len(stages)} more stages"
    return (f"version 7 trained for {more} on unseen records of the same mix (bf16 autocast on a CPU with "
            f"AMX){first}. {before}history.")


def lineage_v8(stages: list[str], minutes: float) -> str:
    """Lineage of version 8: `v8_account(stages)`, then how to reproduce it; `minutes` is the
    whole lineage's training clock (the card's total row)."""
    return textwrap.fill(f"This is version 8 of the shipped weights: {v8_account(stages)} {reproduces(8, minutes)}",
                         width=100)


def v10_account() -> str:
    """What version 10 is, from "version 9 continued by two stages" to "... (docs/training.md, "The
    end weight").": the two `V10=1` stages, `wedlm-deep13` and `wedlm-deep14` (minutes and weights
    read from their configs). Shared by the lineages of version 10 and of version 11."""
    import yaml

    c13, c14 = (yaml.safe_load((REPO / "configs" / f"tiny_wedlm_{n}.yaml").read_text()) for n in ("deep13", "deep14"))
    return (f"version 9 continued by two stages (`V10=1`, bf16 autocast, "
            f"compiled training: `compile: true`). The first (`configs/tiny_wedlm_deep13.yaml`, "
            f"{c13['max_minutes']:g} minutes annealed on the clock) read freshly drawn records with more two-digit "
            f"distractor ranges, carry sums and arithmetic; the second (`configs/tiny_wedlm_deep14.yaml`, "
            f"{c14['max_minutes']:g} minutes, peak learning rate {c14['lr']:g}) lowered the mask stream's end weight "
            f"from {c13['mask_end_weight']:g} to {c14['mask_end_weight']:g}: a weight w on the end token's "
            f"cross-entropy makes a mask slot predict the end once its chance exceeds 1 / (w + 1), and most of "
            f"version 9's own `wedlm` misses were early ends (docs/training.md, \"The end weight\").")


def lineage_v10(minutes: float, v8: list[str] | tuple[str, ...] = ("deep3", "deep4", "deep5")) -> str:
    """Lineage of version 10: `v10_account()`, how to reproduce it, then `v9_account(v8)` as its own
    paragraph. `minutes`: the card's total row."""
    head = textwrap.fill(f"This is version 10 of the shipped weights: {v10_account()} {reproduces(10, minutes)}",
                         width=100)
    return head + "\n\n" + textwrap.fill(f"Version 9 was {v9_account(v8)}", width=100)


def lineage_v11(minutes: float, v8: list[str] | tuple[str, ...] = ("deep3", "deep4", "deep5")) -> str:
    """Lineage of version 11: version 10 continued by the `V11=1` stage `wedlm-deep17` (minutes and
    learning rate read from its config), how to reproduce it, then `v10_account()` and
    `v9_account(v8)` as their own paragraphs. `minutes`: the card's total row."""
    import yaml

    c17 = yaml.safe_load((REPO / "configs" / "tiny_wedlm_deep17.yaml").read_text())
    head = textwrap.fill(
        f"This is version 11 of the shipped weights: version 10 continued by one stage (`V11=1`, "
        f"`configs/tiny_wedlm_deep17.yaml`, {c17['max_minutes']:g} minutes annealed on the clock, peak learning "
        f"rate {c17['lr']:g}, bf16 autocast, compiled) on freshly drawn records of version 10's mix, with random "
        f"block offsets (`random_block_offset: true`, not in the paper): each document's prediction-stream "
        f"blocks start at a random offset. With the fixed blocks of 32 a two-digit sum's end token sat in the "
        f"block after its digits, whose masks see the digits in the clean memory stream, so the mask after a "
        f"result never learned to say \"end\" without them; a forward that filled a result's digits and the slot "
        f"after them wrote \"71 - 31 = 400\" (docs/training.md, \"Block offsets\"). {reproduces(11, minutes)}",
        width=100)
    return (head + "\n\n" + textwrap.fill(f"Version 10 was {v10_account()}", width=100, break_on_hyphens=False)
            + "\n\n" + textwrap.fill(f"Version 9 was {v9_account(v8)}", width=100))


def v9_account(v8: list[str] | tuple[str, ...] = ("deep3", "deep4", "deep5")) -> str:
    """What version 9 is, from "version 8 continued by two stages" to "... are in git history.":
    the two `V9=1` stages, `wedlm-deep11` and `wedlm-deep12` (steps, stop weights and learning
    rates read from their configs), then `v8_account(v8)` (`v8`: version 8's `V8=1` stages, all
    three by default, as shipped). Session 14's trial stages deep7-deep10 were never shipped and
    are no part of it. Shared by the lineages of version 9 and of version 10."""
    import yaml

    c11, c12 = (yaml.safe_load((REPO / "configs" / f"tiny_wedlm_{n}.yaml").read_text()) for n in ("deep11", "deep12"))
    return (f"version 8 continued by two stages (`V9=1`, bf16 autocast). "
            f"The first (`configs/tiny_wedlm_deep11.yaml`, {c11['max_steps']:,} steps) read unseen records of "
            f"version 8's mix with more counting records and two-digit distractor ranges added (`distractor2`): "
            f"ranges in which an earlier value ends in B's last two digits, against the last-two-digits shortcut "
            f"that made version 8 stop 100 before B (docs/training.md, \"The last-two-digits shortcut\"), with the "
            f"AR stop weight at {c11['end_weight']:g} (`end_weight`) and the mask stream's end weight at "
            f"{c11['mask_end_weight']:g} (`mask_end_weight`), each block's leftmost mask still weighted "
            f"{c11['first_mask_weight']:g}x. The second (`configs/tiny_wedlm_deep12.yaml`, {c12['max_steps']:,} steps, "
            f"peak learning rate {c12['lr']:g}) added sums and differences next to a change in their number of "
            f"digits (`carry`), where `wedlm` had written a sum's last digit twice (\"67 + 17 = 844\"; "
            f"docs/training.md, \"Where a sum ends\"). Version 8 was {v8_account(list(v8))}")


def lineage_v9(minutes: float, v8: list[str] | tuple[str, ...] = ("deep3", "deep4", "deep5")) -> str:
    """Lineage of version 9: `v9_account(v8)`, then how to reproduce it; `minutes`: the card's
    total row."""
    return textwrap.fill(f"This is version 9 of the shipped weights: {v9_account(v8)} {reproduces(9, minutes)}",
                         width=100)


LINEAGE_V2 = """This is version 2 of the shipped weights. Version 1 (a 2.4M model of the same shape trained on
synthetic text, CPython stdlib code and chat SFT on a shared, slowed machine) decoded "Count
from 1 to 200." right only with `ar`/`verified` and scored near 0% on held-out counting and
arithmetic; it is in git history. Version 2 was retrained from scratch (same tokenizer, same
shape) with the official mask count per block (`round(gamma * n)`, none when 0), 8 learnable
`<|im_end|>` after every answer, and a curriculum a model this size can learn. The recipe
reproduces it from an empty `runs/` folder."""

LINEAGE_V3 = """This is version 3 of the shipped weights. Version 1 (a 2.4M model of the same shape trained on
synthetic text, CPython stdlib code and chat SFT on a shared, slowed machine) decoded "Count
from 1 to 200." right only with `ar`/`verified` and scored near 0% on held-out counting and
arithmetic. Version 2 was retrained from scratch (same tokenizer, same shape) with the official
mask count per block (`round(gamma * n)`, none when 0), 8 learnable `<|im_end|>` after every
answer, and the curriculum below: stages 1-3 of the recipe (AR 30 min + WeDLM 88 min), its WeDLM
stage on one thread of a shared machine. Version 3 continues version 2's weights with a fourth
stage (`configs/tiny_wedlm_cont.yaml`, two threads of a quiet machine) on curriculum records the
earlier stages never read, with counting capped at 16,000 records (72% of the answer tokens
instead of 80%). Both older versions are in git history. `CONTINUE=1 bash recipes/wedlm_tiny.sh`
reproduces version 3 from an empty `runs/` folder (stages 1-3, export, then stage 4)."""

LINEAGE_V4 = """This is version 4 of the shipped weights. Version 1 (a 2.4M model of the same shape trained on
synthetic text, CPython stdlib code and chat SFT on a shared, slowed machine) decoded "Count
from 1 to 200." right only with `ar`/`verified` and scored near 0% on held-out counting and
arithmetic. Version 2 was retrained from scratch (same tokenizer, same shape) with the official
mask count per block (`round(gamma * n)`, none when 0), 8 learnable `<|im_end|>` after every
answer, and the curriculum below: stages 1-3 of the recipe. Version 3 continued it with a fourth
stage on records the earlier stages never read. Version 3 counted right from any start but did
not read the end value B from the prompt (it stopped at a constant rate per number). Version 4
continues version 3 with WeDLM stages: 1-6-term "Count from A to B." records, on which the
model learns to read B in a few hundred steps (a step in the AR loss), then a mix that keeps
those records and brings back every task{forms} (docs/training.md, "Stopping at the end value").
The older versions are in git history. `V4=1 bash recipes/wedlm_tiny.sh` reproduces version 4
from an empty `runs/` folder (stages 1-4, then {v4_stages})."""

DATA_V4 = """
Stage 5 (`configs/tiny_wedlm_simple.yaml`) reads 1-6-term "Count from A to B." records
(`python -m wedlm.data.curriculum --out data/stop2 --simple-stop 200000`, train split):

{simple}

Stage 6 (`configs/tiny_wedlm_mix.yaml`) reads the mix written by the `--mix` command in that
file's header (simple records of 1-6 and 1-15 terms, 2-20-term ranges of every counting form,
usual counting, arithmetic and list operations; train split):

{mix}
{forms}"""

DATA_FORMS = """
Stage 7 (`configs/tiny_wedlm_forms.yaml`) reads the mix of that file's header (unseen records:
more arithmetic and list operations, and 1-6-term ranges of every counting form):

{rows}
"""

DATA_CONT = """
The continued stage reads records 150,000..349,999 (never read before) with at most 16,000
counting records:

{rows}
"""

END_PROBE = """
### Where the AR head puts the end (teacher-forced, `end_probe` in wedlm/evaluate/mask_probe.py)

p(end) = the AR head's probability of `<|im_end|>` as the next token, on the reference answer.
"Ends exactly there": above 0.5 where the answer ends and below 0.5 at every earlier answer
position. A model that does not read the end value from the prompt gives the end no more
probability than any other place a number ends.

{rows}
"""

TEMPLATE = """# wedlm-tiny

A {params}-parameter WeDLM (causal diffusion language model, arXiv 2512.22737) trained from
scratch in {minutes} minutes{recipe_minutes} on a 2-core CPU by `bash recipes/wedlm_tiny.sh`: AR training ->
conversion (adds `[MASK]`) -> WeDLM training with Dual-Stream Masking + AR loss, at toy scale.
It is the default model of the demo, the tests and the benchmarks. Nothing was downloaded: the
tokenizer and every training example are generated by this repository.

{can_do}

## Model

| | |
|---|---|
| architecture | Qwen3-style decoder (RMSNorm, SwiGLU, GQA, RoPE, q/k norm), `model_type: wedlm` |
| size | hidden {hidden_size}, {num_hidden_layers} layers, {num_attention_heads} heads / {num_key_value_heads} KV heads, head_dim {head_dim}, FFN {intermediate_size}, tied embeddings |
| parameters | {params} (fp32, folder {size} MB) |
| vocabulary | {vocab_size} byte-level BPE tokens, digits one per token; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|mask|>` (id {mask_token_id}); ChatML template |
| context | {max_position_embeddings} positions (trained on packed rows of 1024 tokens) |
| decoding defaults (`generation_config.json`) | window W={window}, entropy threshold tau={tau}, position penalty lambda={lam}{stop_by_ar}; stop on `<|im_end|>` / `<|endoftext|>` |

## Lineage

{lineage}

## Data (`python -m wedlm.data.curriculum --out data/curriculum`)

Chat records of three generated task families; every example has a key (its range or prompt)
and keys are split by hash into train (90%), validation (5%, used only to tune decoding) and
test (5%, used only for the table below). The stages read the first 150,000 training records:

{data}
{data_cont}
## Training (`bash recipes/wedlm_tiny.sh`; training clock summed over resumes)

{stages}

CPU: {cpu}. In version 2 the machine was shared with other jobs: the AR stage ran on 2
threads, the WeDLM stage on one (`OMP_NUM_THREADS=1`, nice -15; two threads stalled on the
shared cores, see docs/training.md).{cont_cpu} The AR stage scores answer tokens
only (prompts are never scored). The WeDLM stage uses blocks of B=32, per-block masking ratio
gamma ~ U(0, 1] with round(gamma * n) masked tokens, loss weights 1/gamma (Eq. 10), AR-loss
weight 1.0 (mask + AR), packed rows of 1024 clean tokens (2048 with the prediction stream), 4
rows per step, AdamW (betas 0.9/0.95, weight decay 0.1), gradient clipping 1.0, linear warmup
and a cosine schedule on wall clock. Prompts are never masked or scored.

![learning curves](plots/learning_curves.png){earlier_curves}

## Decoding defaults

`{tune_cmd}`: {tune}.

## Evaluation (test split, greedy, the defaults above; {eval_precision})

    python recipes/eval_wedlm_tiny.py {eval_args}

{eval_table}

`verified` (WeDLM drafts checked by the AR head) gave a text different from `ar` on
{verified_diff} items. Tokens per forward = generated tokens / decode forwards; p_cache =
generated tokens / tokens fed through the network after prefill (Eq. 4); "stopped" = the answer
ended with an end token rather than at the token budget.

### What the mask slots know (teacher-forced, wedlm/evaluate/mask_probe.py)

After a correct prefix, a window of W [MASK] slots at the next positions; slot d predicts the
token d places ahead. Accepted fills are those whose entropy + lambda * d is below tau (Eq. 11).
The last column: of the windows whose slot k is the answer's end token (the answer's last k
tokens still masked before it: k = 2 for the two digits of "71 - 31 = 40"), the share whose
argmax is the end; a forward that fills a result and the slot after it at once relies on it.

{probe}

![slot accuracy](plots/slot_accuracy.png)
![calibration](plots/calibration.png)
{end_probe}
{notes}
"""

if __name__ == "__main__":
    raise SystemExit(main())
