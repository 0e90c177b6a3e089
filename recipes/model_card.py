"""Write models/wedlm-tiny/README.md (the model card) from the recipe's logs and the evaluation.

    python recipes/model_card.py --run runs/wedlm-tiny --eval runs/wedlm-tiny/eval/summary.json

Reads stages.jsonl (wall clock per stage), each stage's log.jsonl and final/config.json
(steps, tokens, final losses), data/stats.json (corpus sizes) and the evaluation summary
written by recipes/eval_wedlm_tiny.py, so every number in the card comes from a file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STAGES = [("ar", "AR pretraining", "configs/tiny_ar.yaml", "data/pretrain.jsonl"),
          ("wedlm", "WeDLM continued training (dual-stream masking + AR loss)", "configs/tiny_wedlm.yaml",
           "data/pretrain.jsonl"),
          ("sft", "chat SFT (dual-stream masking + AR loss, prompts unmasked)", "configs/tiny_sft.yaml",
           "data/sft.jsonl (capped per source)")]


def stage_rows(run: Path) -> list[str]:
    seconds: dict[str, int] = {}
    for line in (run / "stages.jsonl").read_text().splitlines():
        rec = json.loads(line)
        seconds[rec["stage"]] = seconds.get(rec["stage"], 0) + rec["seconds"]
    rows = ["| stage | config | data | steps | tokens (clean) | wall clock | final losses (mean of last 5 logged steps) |",
            "|---|---|---|---|---|---|---|"]
    for name, title, cfg, data in STAGES:
        meta = json.loads((run / name / "final" / "config.json").read_text()).get("wedlm_training", {})
        log = [json.loads(x) for x in (run / name / "log.jsonl").read_text().splitlines()]
        steps = meta["steps"] if "ended_by" in meta else log[-1]["step"]  # older finals: last logged step
        tail = log[-5:]
        ar = sum(r["ar_loss"] for r in tail) / len(tail)
        mask = sum(r["mask_loss"] for r in tail) / len(tail)
        losses = f"AR {ar:.3f}" + (f", mask {mask:.3f}" if name != "ar" else "")
        tokens = meta.get("tokens", log[-1]["tokens"])
        clock = meta.get("elapsed_s", log[-1]["elapsed_s"])  # training clock, summed over resumes
        seconds[name] = clock
        rows.append(f"| {title} | `{cfg}` | {data} | {steps} | {tokens / 1e6:.2f}M | "
                    f"{clock / 60:.1f} min | {losses} |")
    rows.append(f"| conversion (`wedlm convert`) | - | - | - | - | {seconds.get('convert', 0)} s | - |")
    total = sum(seconds.values())
    rows.append(f"| **total** | | | | | **{total / 60:.1f} min** | |")
    return rows


def main(argv: list[str] | None = None) -> int:
    from recipes.eval_wedlm_tiny import markdown  # noqa: E402  (script module next to this one)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default=str(REPO / "runs" / "wedlm-tiny"))
    p.add_argument("--eval", default=str(REPO / "runs" / "wedlm-tiny" / "eval" / "summary.json"))
    p.add_argument("--model", default=str(REPO / "models" / "wedlm-tiny"))
    p.add_argument("--notes", default=None, help="markdown file appended as 'Findings'")
    args = p.parse_args(argv)
    run, model = Path(args.run), Path(args.model)
    cfg = json.loads((model / "config.json").read_text())
    gen = json.loads((model / "generation_config.json").read_text())
    summary = json.loads(Path(args.eval).read_text())
    stats = json.loads((REPO / "data" / "stats.json").read_text())["files"]
    from wedlm.model import load_model
    n_params = sum(p.numel() for p in load_model(model).parameters())
    size_mb = sum(f.stat().st_size for f in model.iterdir() if f.is_file()) / 1e6
    card = TEMPLATE.format(
        params=f"{n_params / 1e6:.2f}M", size=f"{size_mb:.1f}", **{k: cfg[k] for k in (
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "max_position_embeddings", "mask_token_id")},
        window=gen["wedlm_window_size"], tau=gen["wedlm_entropy_threshold"], lam=gen["wedlm_pos_penalty_factor"],
        pre_tokens=f"{stats['pretrain.jsonl']['tokens'] / 1e6:.1f}M", pre_records=stats["pretrain.jsonl"]["records"],
        sft_tokens=f"{stats['sft.jsonl']['tokens'] / 1e6:.1f}M", sft_records=stats["sft.jsonl"]["records"],
        stages="\n".join(stage_rows(run)), eval_table=markdown(summary),
        eval_tau=summary["tau"], eval_lam=summary["lambda"], eval_window=summary["window"],
        notes=Path(args.notes).read_text() if args.notes else "")
    (model / "README.md").write_text(card)
    print(f"wrote {model / 'README.md'}")
    return 0


TEMPLATE = """# wedlm-tiny

A {params}-parameter WeDLM (causal diffusion language model, arXiv 2512.22737) trained from
scratch on this project's 2-core CPU machine by `recipes/wedlm_tiny.sh`: the paper's pipeline
(AR pretraining -> conversion -> WeDLM training with Dual-Stream Masking + AR loss -> SFT) at
toy scale. It is the default model of the demo, the tests and the benchmarks. Nothing was
downloaded: the tokenizer and all data are generated here or read from the CPython standard
library that ships with Python.

## Model

| | |
|---|---|
| architecture | Qwen3-style decoder (RMSNorm, SwiGLU, GQA, RoPE, q/k norm), `model_type: wedlm` |
| size | hidden {hidden_size}, {num_hidden_layers} layers, {num_attention_heads} heads / {num_key_value_heads} KV heads, head_dim {head_dim}, FFN {intermediate_size}, tied embeddings |
| parameters | {params} (fp32, folder {size} MB) |
| vocabulary | {vocab_size} byte-level BPE tokens, digits one per token; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|mask|>` (id {mask_token_id}); ChatML template |
| context | {max_position_embeddings} positions (trained on packed rows of 1024 tokens) |
| decoding defaults (`generation_config.json`) | window W={window}, entropy threshold tau={tau}, position penalty lambda={lam}; stop on `<|im_end|>` / `<|endoftext|>` |

## Data (`python -m wedlm.data.build --out data --tokenizer-out models/wedlm-tiny`, seed 1234)

* pretraining: {pre_records} documents, {pre_tokens} tokens: synthetic tasks as `prompt\\nanswer` +
  EOS (counting with random start/end/step and direction, letter/word sequences, multi-step
  arithmetic word problems with step-by-step solutions and a `Final answer:` line, linear
  equations) and ~2000-character chunks of CPython stdlib source (40% of tokens);
* SFT: {sft_records} ChatML conversations, {sft_tokens} tokens (the same tasks plus "Complete this
  Python code:"), of which the SFT stage reads the first 24,000 with code capped at 500;
* held-out evaluation: task items from seed 999,999 and hash buckets training never uses, and
  stdlib files split off by path hash (`data/eval/`).

## Training (`bash recipes/wedlm_tiny.sh`, resumable; wall clock = each stage's training clock summed over resumes)

{stages}

Dual-stream stages use blocks of B=32, per-block masking ratio gamma ~ U(0, 1], loss weights
1/gamma (Eq. 10), AR-loss weight 1.0, packed rows of 1024 clean tokens (2048 with the
prediction stream), 4 rows per step, AdamW (betas 0.9/0.95, weight decay 0.1), gradient
clipping 1.0, linear warmup and a cosine schedule on wall clock (`schedule_by_time`), fp32.
Mask losses are over masked prediction-stream slots only; AR losses over scored memory-stream
next tokens (in SFT: response tokens only).

## Evaluation (held-out; greedy; WeDLM decoding with W={eval_window}, tau={eval_tau}, lambda={eval_lam})

    OMP_NUM_THREADS=1 python recipes/eval_wedlm_tiny.py --model models/wedlm-tiny --out runs/wedlm-tiny/eval --limit 30

(`wedlm eval --tasks counting,arithmetic,equation --decoding ar|wedlm` for the task rows; the
perplexity row is `python -m wedlm.train.perplexity --model models/wedlm-tiny --data
data/eval/code_heldout.jsonl`; code completion is 16 held-out stdlib prefixes, 128 new tokens.)

{eval_table}

Tokens per forward = generated tokens / decode forwards; p_cache = generated tokens / tokens
fed through the network after prefill (Eq. 4; AR is 1.0 by definition).

{notes}
"""

if __name__ == "__main__":
    raise SystemExit(main())
