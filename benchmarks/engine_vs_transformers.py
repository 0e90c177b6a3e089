"""Engine vs transformers `generate`: batch 1, greedy, random-weight configs of ~6M and ~40M params.

Prints, from one run: tok/s of transformers generate and of the engine's `ar`
mode (and their ratio), then tok/s, tokens/forward and p_cache (paper Eq. 4)
for every decoder. Random weights make WeDLM's predictions high-entropy, so the
parallel decoders fall back to one fill per step here; pass --model to measure
a trained checkpoint as well.

    python benchmarks/engine_vs_transformers.py [--threads 1] [--new-tokens 256] [--model PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

DECODER_RUNS = [
    ("ar", {}),
    ("wedlm", {}),
    ("wedlm", {"wedlm_fallback": "argmin"}),
    ("blockwise", {}),
    ("verified", {}),
]


@dataclass
class Args:
    threads: int
    new_tokens: int
    prompt_len: int
    model: str | None
    window: int
    repeats: int


def parse() -> Args:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both sides")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats; best kept")
    ap.add_argument("--model", default=None, help="also benchmark this checkpoint folder")
    ns = ap.parse_args()
    return Args(ns.threads, ns.new_tokens, ns.prompt_len, ns.model, ns.window, ns.repeats)


def load_hf(path: Path):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


def hf_run(model, prompt: list[int], n: int) -> dict:
    """Greedy transformers generate of exactly n tokens (EOS disabled); tok/s and the ids."""
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, **kw)
        elapsed = time.perf_counter() - start
    assert out.shape[1] - len(prompt) == n
    return {"tok_s": n / elapsed, "ids": out[0, len(prompt):].tolist()}


def engine_run(llm, prompt: list[int], n: int, decoding: str, extra: dict) -> dict:
    from wedlm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, decoding=decoding, **extra)
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    elapsed = time.perf_counter() - start
    s = out["stats"]
    return {"tok_s": len(out["token_ids"]) / elapsed, "tpf": s["tokens_per_forward"], "p_cache": s["p_cache"],
            "forwards": s["decode_forwards"], "tokens": len(out["token_ids"]), "ids": out["token_ids"]}


def bench_checkpoint(name: str, path: Path, args: Args, with_hf: bool) -> None:
    from wedlm import LLM

    prompt = [(37 * i + 11) % 200 for i in range(args.prompt_len)]
    llm = LLM(str(path), wedlm_window_size=args.window, device="cpu", dtype="float32",
              max_model_len=args.prompt_len + args.new_tokens + 8, max_num_seqs=4)
    n_params = sum(p.numel() for p in llm.engine.model.parameters())
    print(f"\n== {name}: {n_params / 1e6:.1f}M params, prompt {len(prompt)}, {args.new_tokens} new tokens, "
          f"W={args.window}, {torch.get_num_threads()} thread(s)")
    hf_model = load_hf(path) if with_hf else None
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):  # interleaved repeats; the best of each is kept (busy, shared CPUs)
        if hf_model is not None:
            runs.setdefault("transformers", []).append(hf_run(hf_model, prompt, args.new_tokens))
        for decoding, extra in DECODER_RUNS:
            label = decoding + ("/" + extra["wedlm_fallback"] if extra else "")
            runs.setdefault(label, []).append(engine_run(llm, prompt, args.new_tokens, decoding, extra))
    results = {k: max(v, key=lambda r: r["tok_s"]) for k, v in runs.items()}
    if hf_model is not None:
        hf = results.pop("transformers")
        ar = results["ar"]
        print(f"transformers generate: {hf['tok_s']:8.1f} tok/s")
        print(f"engine ar            : {ar['tok_s']:8.1f} tok/s   ratio {ar['tok_s'] / hf['tok_s']:.2f}x   "
              f"same tokens: {'yes' if ar['ids'] == hf['ids'] else 'NO'}")
    print(f"{'decoder':18s} {'tok/s':>8s} {'tok/fwd':>8s} {'p_cache':>8s} {'forwards':>8s} {'=ar?':>5s}")
    for label, r in results.items():
        same = "yes" if r["ids"] == results["ar"]["ids"] else "no"
        print(f"{label:18s} {r['tok_s']:8.1f} {r['tpf']:8.2f} {r['p_cache']:8.3f} {r['forwards']:8d} {same:>5s}")


def main() -> None:
    from wedlm.testing import MEDIUM_40M, SMALL_6M, make_hf_checkpoint

    args = parse()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in (("random ~6M", SMALL_6M), ("random ~40M", MEDIUM_40M)):
            path = make_hf_checkpoint(Path(tmp) / name.split()[-1], family="qwen3", wedlm=True,
                                      tokenizer=True, seed=0, **cfg)
            bench_checkpoint(name, path, args, with_hf=True)
    if args.model:
        bench_checkpoint(args.model, Path(args.model), args, with_hf=False)


if __name__ == "__main__":
    main()
