"""Build the tiny WeDLM model's datasets and tokenizer: ``python -m wedlm.data.build``.

What: trains the tokenizer (into ``--tokenizer-out``), then writes into ``--out``:
- ``pretrain.jsonl``: ``{"text", "source"}`` documents for pretraining, ONE
  synthetic example per document (``prompt\\nanswer``; the trainer appends EOS, so
  the model learns where an answer stops) or one ~2000-char stdlib code chunk;
  about 60% synthetic / 40% code by tokens, shuffled with the seed;
- ``sft.jsonl``: ``{"messages", "source"}`` ChatML records of the synthetic tasks
  plus "Complete this Python code:" records cut from stdlib train chunks;
- ``eval/{counting,arithmetic,equation}.jsonl``: held-out task examples;
- ``eval/code_heldout.jsonl``: ``{"path", "index", "text"}`` held-out stdlib chunks;
- ``stats.json``: records, characters and tokens per file, vocab size, seconds.

Why: one deterministic command produces everything training and evaluation
read, so a run can be reproduced from ``--seed``. Files are written to a temp
name and renamed, so a trainer polling ``data/`` never reads a partial file.
Train items come only from training seeds and never include held-out keys
(see ``wedlm.data.synthetic``); code is split by path hash.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from wedlm.data import synthetic
from wedlm.data.code_corpus import CodeChunk, code_chunks
from wedlm.data.tokenizer_build import build_tokenizer

# Share of the synthetic pretraining TOKENS per task (counting examples are long).
PRETRAIN_TASK_SHARE = {"counting": 0.35, "sequence": 0.15, "arithmetic": 0.35, "equation": 0.15}
SFT_TASK_RECORDS = {"counting": 15_000, "sequence": 8_000, "arithmetic": 25_000,
                    "equation": 12_000, "code": 6_000}
EVAL_TASKS = ("counting", "arithmetic", "equation")
PRETRAIN_OFFSET, SFT_OFFSET = 0, 500  # training seed offsets; batches count up from these
BATCH = 2000


@dataclass(slots=True)
class BuildConfig:
    """Options of one build; ``quick`` shrinks everything to run in seconds (tests)."""

    out: Path = Path("data")
    tokenizer_out: Path = Path("models/wedlm-tiny")
    seed: int = synthetic.TRAIN_BASE_SEED
    quick: bool = False
    vocab_size: int = 4096
    pretrain_tokens: int = 5_000_000
    code_fraction: float = 0.4
    sft_scale: float = 1.0
    eval_n: int = 200

    def __post_init__(self) -> None:
        self.out, self.tokenizer_out = Path(self.out), Path(self.tokenizer_out)
        if self.seed == synthetic.HELDOUT_SEED:
            raise ValueError("seed 999_999 is reserved for held-out evaluation")
        if not 0.0 <= self.code_fraction <= 1.0:
            raise ValueError(f"code_fraction must be in [0, 1], got {self.code_fraction}")
        if self.quick and self.tokenizer_out == Path("models/wedlm-tiny"):
            raise ValueError("--quick would overwrite the shipped tokenizer; pass --tokenizer-out")
        if self.quick:
            self.vocab_size = min(self.vocab_size, 1024)
            self.pretrain_tokens, self.sft_scale, self.eval_n = 60_000, 0.005, 20


# ------------------------------------------------------------------ helpers ---

def write_jsonl(path: Path, records: Iterable[dict]) -> int:
    """Write ``records`` one JSON object per line via a temp file + rename; returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def chatml(messages: list[dict]) -> str:
    """Render messages exactly as the tokenizer's chat template does (no generation prompt)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


class TokenCounter:
    """Counts tokens of texts in batches with the trained tokenizer's fast backend."""

    def __init__(self, hf_tokenizer) -> None:
        self._tok = hf_tokenizer.backend_tokenizer

    def counts(self, texts: list[str]) -> list[int]:
        """Number of tokens of each text (no special tokens added)."""
        return [len(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]


# ----------------------------------------------------------------- pretrain ---

def synthetic_pretrain_docs(cfg: BuildConfig, counter: TokenCounter, token_budget: int) -> list[dict]:
    """Generate one-example documents per task until each task's token share is reached."""
    docs = []
    bar = tqdm(total=token_budget, desc="pretrain synthetic", unit="tok", unit_scale=True)
    for task, share in PRETRAIN_TASK_SHARE.items():
        budget, used, batch = int(token_budget * share), 0, 0
        while used < budget:
            examples = synthetic.train_examples(task, BATCH, PRETRAIN_OFFSET + batch, cfg.seed)
            texts = [synthetic.to_text(ex) for ex in examples]
            for text, n in zip(texts, counter.counts(texts)):
                if used >= budget:
                    break
                docs.append({"text": text, "source": task})
                used += n
                bar.update(n)
            batch += 1
    bar.close()
    return docs


def code_pretrain_docs(chunks: list[CodeChunk], counter: TokenCounter, token_budget: int,
                       rng: random.Random) -> list[dict]:
    """Take shuffled stdlib train chunks until ``token_budget`` tokens."""
    order = list(range(len(chunks)))
    rng.shuffle(order)
    docs, used = [], 0
    bar = tqdm(total=token_budget, desc="pretrain code", unit="tok", unit_scale=True)
    for start in range(0, len(order), 256):
        picked = [chunks[i].text for i in order[start:start + 256]]
        for text, n in zip(picked, counter.counts(picked)):
            if used >= token_budget:
                break
            docs.append({"text": text, "source": "code"})
            used += n
            bar.update(n)
        if used >= token_budget:
            break
    bar.close()
    return docs


# ---------------------------------------------------------------------- sft ---

def code_completion_record(chunk: CodeChunk, rng: random.Random, max_chars: int = 1200) -> dict | None:
    """Cut a chunk's first ~``max_chars`` characters at a random line into prompt/continuation."""
    lines, size = [], 0
    for line in chunk.text.splitlines(keepends=True):
        if size + len(line) > max_chars and lines:
            break
        lines.append(line)
        size += len(line)
    if len(lines) < 4:
        return None
    cut = rng.randint(max(1, len(lines) // 4), len(lines) - 2)
    prefix, rest = "".join(lines[:cut]), "".join(lines[cut:]).rstrip("\n")
    if not prefix.strip() or not rest.strip():
        return None
    messages = [{"role": "user", "content": f"Complete this Python code:\n{prefix}"},
                {"role": "assistant", "content": rest}]
    return {"messages": messages, "source": "code"}


def sft_records(cfg: BuildConfig, chunks: list[CodeChunk], rng: random.Random) -> list[dict]:
    """Chat records for every synthetic task and for code completion, shuffled."""
    records = []
    for task, n in tqdm(SFT_TASK_RECORDS.items(), desc="sft", unit="task"):
        n = max(1, int(n * cfg.sft_scale))
        if task == "code":
            while n > 0:
                rec = code_completion_record(rng.choice(chunks), rng)
                if rec is not None:
                    records.append(rec)
                    n -= 1
            continue
        for ex in synthetic.train_examples(task, n, SFT_OFFSET, cfg.seed):
            records.append({**synthetic.to_chat(ex), "source": task})
    rng.shuffle(records)
    return records


# -------------------------------------------------------------------- build ---

def _stats(texts: list[str], counter: TokenCounter) -> dict:
    tokens = sum(sum(counter.counts(texts[i:i + 4096])) for i in range(0, len(texts), 4096))
    return {"records": len(texts), "chars": sum(map(len, texts)), "tokens": tokens}


def build(cfg: BuildConfig) -> dict:
    """Run the whole build described in the module docstring; returns the stats dict."""
    t0 = time.time()
    tok_chars = (200_000, 300_000) if cfg.quick else (2_000_000, 3_000_000)
    print(f"training tokenizer (vocab {cfg.vocab_size}) -> {cfg.tokenizer_out}")
    hf = build_tokenizer(cfg.tokenizer_out, cfg.vocab_size, cfg.seed, *tok_chars)
    counter, rng = TokenCounter(hf), random.Random(f"build:{cfg.seed}")
    train_chunks = list(code_chunks("train"))

    code_budget = int(cfg.pretrain_tokens * cfg.code_fraction)
    pretrain = synthetic_pretrain_docs(cfg, counter, cfg.pretrain_tokens - code_budget)
    pretrain += code_pretrain_docs(train_chunks, counter, code_budget, rng)
    rng.shuffle(pretrain)
    sft = sft_records(cfg, train_chunks, rng)
    evals = {task: synthetic.heldout_examples(task, cfg.eval_n) for task in EVAL_TASKS}
    heldout_code = [asdict(c) for c in code_chunks("heldout")][: 10 if cfg.quick else None]

    stats = {"pretrain.jsonl": _stats([d["text"] for d in pretrain], counter),
             "sft.jsonl": _stats([chatml(r["messages"]) for r in sft], counter)}
    write_jsonl(cfg.out / "pretrain.jsonl", tqdm(pretrain, desc="write pretrain", unit="doc"))
    write_jsonl(cfg.out / "sft.jsonl", sft)
    for task, examples in evals.items():
        write_jsonl(cfg.out / "eval" / f"{task}.jsonl", examples)
        stats[f"eval/{task}.jsonl"] = _stats([synthetic.to_text(e) for e in examples], counter)
    write_jsonl(cfg.out / "eval" / "code_heldout.jsonl", heldout_code)
    stats["eval/code_heldout.jsonl"] = _stats([c["text"] for c in heldout_code], counter)

    summary = {"config": {k: str(v) for k, v in asdict(cfg).items()}, "vocab_size": len(hf),
               "seconds": round(time.time() - t0, 1), "files": stats}
    (cfg.out / "stats.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def parse_args(argv: list[str] | None = None) -> BuildConfig:
    """Parse the command line into a ``BuildConfig``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("data"))
    p.add_argument("--tokenizer-out", type=Path, default=Path("models/wedlm-tiny"))
    p.add_argument("--seed", type=int, default=synthetic.TRAIN_BASE_SEED)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--pretrain-tokens", type=int, default=5_000_000)
    p.add_argument("--quick", action="store_true", help="tiny outputs in seconds (tests)")
    a = p.parse_args(argv)
    return BuildConfig(out=a.out, tokenizer_out=a.tokenizer_out, seed=a.seed, quick=a.quick,
                       vocab_size=a.vocab_size, pretrain_tokens=a.pretrain_tokens)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m wedlm.data.build``; prints a size table when done."""
    summary = build(parse_args(argv))
    for name, s in summary["files"].items():
        print(f"{name:28s} {s['records']:>8d} records {s['chars']:>11,d} chars {s['tokens']:>10,d} tokens")
    print(f"vocab {summary['vocab_size']}, {summary['seconds']} s")


if __name__ == "__main__":
    main()
