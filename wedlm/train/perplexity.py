"""Teacher-forced perplexity of a checkpoint on held-out text: `python -m wedlm.train.perplexity`.

What: each JSONL record's `text` (e.g. data/eval/code_heldout.jsonl, stdlib files
never trained on) is tokenised, cut into windows of at most `max_len` tokens,
and scored with the plain causal mask (next-token NLL); the result is
exp(total NLL / total predicted tokens).

Why: open-ended code has no exact answer; perplexity measures what the model
learned about it, and is the same number whichever decoder later samples from
the model (WeDLM keeps the model a causal LM through its auxiliary AR loss).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from wedlm.model import DenseAttention, load_model
from wedlm.tokenizer import load_tokenizer

from .data import read_jsonl


@torch.no_grad()
def perplexity(model_dir: str | Path, data: str | Path, max_len: int = 1024, limit: int | None = None) -> dict:
    """{"ppl", "nll", "tokens", "records"} of the checkpoint on `data`'s `text` fields."""
    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    texts = [r["text"] for r in read_jsonl(data, limit)]
    total_nll, total_tokens = 0.0, 0
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        for start in range(0, len(ids) - 1, max_len):
            window = torch.tensor(ids[start:start + max_len + 1])[None]  # [1, n+1]
            if window.shape[1] < 2:
                continue
            inputs, targets = window[:, :-1], window[:, 1:]
            positions = torch.arange(inputs.shape[1])[None]
            logits = model(inputs, positions, DenseAttention())
            total_nll += float(F.cross_entropy(logits[0], targets[0], reduction="sum"))
            total_tokens += targets.shape[1]
    nll = total_nll / max(total_tokens, 1)
    return {"ppl": math.exp(nll), "nll": nll, "tokens": total_tokens, "records": len(texts)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args(argv)
    print(json.dumps(perplexity(args.model, args.data, args.max_len, args.limit)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
