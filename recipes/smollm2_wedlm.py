"""From a real AR chat model to a WeDLM: SmolLM2-135M-Instruct, converted and taught mask recovery
by self-distillation (docs/method.md, "Training"; paper section 4.2).

    python scripts/fetch_smollm2.py                      # the model (once)
    python recipes/smollm2_wedlm.py [--out runs/smollm2-wedlm] [--prompts 300] [--held-out 16] [--steps 40]

1. `wedlm convert` the float32 folder (the vocabulary grows by 64 rows for `<|mask|>`);
2. generate varied chat prompts from templates (`make_prompts`) and answer each with the engine's
   own greedy `ar` decoding of the converted model: training targets that are exactly the AR
   model's distribution, so `verified` decoding stays lossless and a good WeDLM fills the window
   with the tokens AR would have produced;
3. measure, on held-out prompts, tokens per forward of `wedlm` and `verified` decoding and how
   many `wedlm` answers equal the AR answer, before training;
4. a few dual-stream SFT steps (`stage: wedlm`, chat format, AR loss on) from the converted weights;
5. the same measurements on the trained checkpoint.

Writes OUT/init (converted), OUT/data/{train,held_out}.jsonl, OUT/sft (the training run,
final/ its checkpoint) and OUT/results.json, and prints one table. Every step is skipped when its
output exists. CPU-sized defaults (minutes on 2 cores); on a GPU raise --prompts / --steps and
pass --device cuda.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

# A KV cache for 32 answers of 512 tokens (0.75 GB for this model) instead of the CPU default's 4 GiB;
# float32 arithmetic (no bf16 autocast), so `verified` and `ar` compare exactly.
ENGINE = {"max_model_len": 512, "max_num_seqs": 32, "autocast": False}
COUNTRIES = ["Japan", "France", "Italy", "Spain", "Germany", "Canada", "Brazil", "Egypt", "India", "Kenya",
             "Mexico", "Norway", "Peru", "Poland", "Chile", "Greece", "Ireland", "Sweden", "Turkey", "Vietnam"]
TOPICS = ["the sea", "autumn", "a cat", "the moon", "coffee", "rain", "a forest", "friendship", "music", "snow",
          "a city at night", "the desert", "mountains", "a library", "bread"]
THINGS = ["a volcano", "photosynthesis", "gravity", "a rainbow", "an atom", "a computer", "a bridge", "democracy",
          "a vaccine", "electricity", "a glacier", "the internet", "a star", "an earthquake", "a battery"]
CATEGORIES = ["fruits", "colors", "animals", "planets", "musical instruments", "sports", "vegetables",
              "programming languages", "birds", "flowers"]
STYLES = ["for a child", "in five words", "as a haiku", "formally", "with an example", "in one line"]
TEMPLATES = [
    ("What is the capital of {}?", COUNTRIES),
    ("Write one sentence about {}.", TOPICS),
    ("Explain {} in one sentence.", THINGS),
    ("Name three {}.", CATEGORIES),
    ("What is {} + {}?", (range(2, 100, 3), range(1, 100, 3))),
    ("What is {} times {}?", (range(2, 30), range(2, 30))),
    ("Give me a short tip about {}.", TOPICS),
    ("What language is spoken in {}?", COUNTRIES),
    ("Describe {} to a child.", THINGS),
    ("Compare {} and {}.", (THINGS, THINGS)),
    ("Write about {} {}.", (TOPICS, STYLES)),
    ("Explain {} {}.", (THINGS, STYLES)),
    ("What do {} and {} have in common?", (COUNTRIES, COUNTRIES)),
    ("Which is bigger, {} or {}?", (THINGS, THINGS)),
    ("Write a short story about {} and {}.", (TOPICS, THINGS)),
]


def make_prompts(n: int, seed: int) -> list[str]:
    """`n` distinct prompts from TEMPLATES (3,160 in all), shuffled with `seed`.

    Raises:
        SystemExit: `n` above the number of distinct prompts.
    """
    pool = []
    for template, fillers in TEMPLATES:
        if isinstance(fillers, tuple):  # two slots: every ordered pair of distinct fillers
            pool += [template.format(a, b) for a, b in itertools.product(*fillers) if a != b]
        else:
            pool += [template.format(f) for f in fillers]
    rng = random.Random(seed)
    rng.shuffle(pool)
    if n > len(pool):
        raise SystemExit(f"smollm2_wedlm: at most {len(pool)} distinct prompts, asked for {n}")
    return pool[:n]


def answer(llm, prompts: list[str], max_tokens: int) -> list[str]:
    """The engine's greedy `ar` answers to chat `prompts`, without the end token."""
    from wedlm import SamplingParams

    ids = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"] for p in prompts]
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens, decoding="ar"))
    return [o["text"] for o in outs]


def write_chat(path: Path, prompts: list[str], answers: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for p, a in zip(prompts, answers):
            f.write(json.dumps({"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}],
                                "source": "self-distilled"}) + "\n")
    tmp.replace(path)


def measure(model_dir: Path, held_out: list[dict], max_tokens: int, device: str, engine: dict) -> dict:
    """Tokens per forward of `wedlm` and `verified` on the held-out prompts and the share of
    `wedlm` answers equal to the AR answer (greedy; `verified` is lossless, so it always is)."""
    from wedlm import LLM, SamplingParams

    llm = LLM(str(model_dir), device=device, dtype="float32", **engine)
    prompts = [r["messages"][0]["content"] for r in held_out]
    ids = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"] for p in prompts]
    ar = llm.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens, decoding="ar"))
    row = {}
    for decoding in ("wedlm", "verified"):
        outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens, decoding=decoding))
        tokens = sum(o["stats"]["decode_tokens"] for o in outs)
        forwards = sum(o["stats"]["decode_forwards"] for o in outs)
        row[decoding] = {"tokens_per_forward": round(tokens / max(forwards, 1), 3),
                         "same_as_ar": sum(o["token_ids"] == a["token_ids"] for o, a in zip(outs, ar)),
                         "answers": len(outs)}
    row["example"] = {"prompt": prompts[0], "ar": ar[0]["text"]}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="AR checkpoint (default: the fetch_smollm2.py folder)")
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2-wedlm"), help="output folder")
    parser.add_argument("--prompts", type=int, default=300, help="self-distillation prompts (training)")
    parser.add_argument("--held-out", type=int, default=16, help="held-out prompts for the measurements")
    parser.add_argument("--steps", type=int, default=40, help="SFT optimizer steps")
    parser.add_argument("--lr", type=float, default=1e-4, help="peak SFT learning rate (cosine to lr/10)")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length limit")
    parser.add_argument("--device", default="cpu", help="engine device (training picks CUDA when present)")
    parser.add_argument("--micro-batch", type=int, default=2, help="SFT rows of 256 tokens per micro-batch (2 per step)")
    parser.add_argument("--max-num-seqs", type=int, default=ENGINE["max_num_seqs"],
                        help="answers decoded at once (the KV cache grows with it)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    engine = {**ENGINE, "max_num_seqs": args.max_num_seqs}

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fetch_smollm2 import FOLDER_NAME, default_dir

    from wedlm import LLM
    from wedlm.convert import convert
    from wedlm.train.config import TrainConfig
    from wedlm.train.trainer import train

    out = args.out
    (out / "data").mkdir(parents=True, exist_ok=True)
    init = out / "init"
    if not (init / "config.json").is_file():
        convert(args.model or default_dir() / FOLDER_NAME, init)
    train_file, held_file = out / "data" / "train.jsonl", out / "data" / "held_out.jsonl"
    if not held_file.is_file():
        prompts = make_prompts(args.prompts + args.held_out, args.seed)
        llm = LLM(str(init), device=args.device, dtype="float32", **engine)
        answers = answer(llm, prompts, args.max_tokens)
        write_chat(train_file, prompts[:args.prompts], answers[:args.prompts])
        write_chat(held_file, prompts[args.prompts:], answers[args.prompts:])
        del llm
    held_out = [json.loads(line) for line in held_file.read_text().splitlines()]
    before = measure(init, held_out, args.max_tokens, args.device, engine)
    cfg = TrainConfig(stage="wedlm", data=str(train_file), data_format="chat", tokenizer=str(init), init=str(init),
                      out_dir=str(out / "sft"), seq_len=256, micro_batch=args.micro_batch, grad_accum=2, block_size=16,
                      lr=args.lr, min_lr=args.lr / 10, warmup_steps=max(1, args.steps // 10), max_steps=args.steps,
                      save_every=args.steps, log_every=max(1, args.steps // 10), seed=args.seed, attention="chunked",
                      chunk=256)
    final = train(cfg)
    after = measure(final, held_out, args.max_tokens, args.device, engine)
    results = {"model": str(args.model or FOLDER_NAME), "prompts": args.prompts, "held_out": len(held_out),
               "steps": args.steps, "max_tokens": args.max_tokens, "before": before, "after": after}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print("| checkpoint | wedlm tokens/forward | wedlm answers == ar | verified tokens/forward | verified == ar |")
    print("|---|---|---|---|---|")
    for name, row in (("converted (before SFT)", before), (f"after {args.steps} SFT steps", after)):
        w, v = row["wedlm"], row["verified"]
        print(f"| {name} | {w['tokens_per_forward']} | {w['same_as_ar']}/{w['answers']} | "
              f"{v['tokens_per_forward']} | {v['same_as_ar']}/{v['answers']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
