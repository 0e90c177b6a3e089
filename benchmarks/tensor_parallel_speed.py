"""Engine `ar` at batch 1 in one process and on 2 tensor-parallel ranks, eager and compiled.

Writes a random-weight `MEDIUM_40M` WeDLM checkpoint (wedlm/testing.py) into `--ckpt`
(once), then for each of (1 rank, eager), (1, compiled), (2, eager), (2, compiled):
builds the engine (fp32, no autocast, one torch thread per rank), generates `--tokens`
tokens once untimed (compiles), and prints the best of `--repeats` timed runs in tokens/s
and whether all four gave the same tokens (they must).

    python benchmarks/tensor_parallel_speed.py --ckpt /tmp/m40
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from wedlm import LLM, SamplingParams
from wedlm.testing import MEDIUM_40M, make_hf_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="/tmp/wedlm-m40", help="checkpoint folder (written when missing)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not (Path(a.ckpt) / "config.json").is_file():
        make_hf_checkpoint(a.ckpt, family="qwen3", wedlm=True, tokenizer=True, seed=0, init_std=0.02, **MEDIUM_40M)
    prompt = [[(7 * j) % 250 + 3 for j in range(64)]]
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True, decoding="ar")
    tokens = {}
    for ranks, eager in [(1, True), (1, False), (2, True), (2, False)]:
        start = time.perf_counter()
        with LLM(a.ckpt, tensor_parallel_size=ranks, enforce_eager=eager, device="cpu", dtype="float32",
                 autocast=False) as llm:
            llm.generate(prompt, params)
            warm = time.perf_counter() - start
            best = float("inf")
            for _ in range(a.repeats):
                t = time.perf_counter()
                out = llm.generate(prompt, params)
                best = min(best, time.perf_counter() - t)
        tokens[(ranks, eager)] = out[0]["token_ids"]
        print(f"ranks={ranks} {'eager' if eager else 'compiled'}: {a.tokens / best:.1f} tokens/s "
              f"(best of {a.repeats}); build + first run {warm:.1f} s", flush=True)
    print("same tokens:", len({tuple(v) for v in tokens.values()}) == 1)


if __name__ == "__main__":
    main()
