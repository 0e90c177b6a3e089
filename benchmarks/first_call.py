"""First-call latency of the default engine: a cold compile cache, then a warm one, then eager.

Each configuration runs in a fresh Python process (one torch thread) that builds `LLM(model)`
with no engine options (the default: compiled where `resolve_enforce_eager` says so) and times,
for one chat-formatted prompt (the tokenizer's chat template, as `wedlm generate --chat`), greedy:
  * load: `LLM(...)` (weights, fused modules, KV cache);
  * first call: the first `generate` of one prompt (compiles, or loads compiled graphs);
  * second call: the same `generate` again (the steady state);
  * graphs and compile s: the compiled forward's own count and time (`CompiledForward`).
The processes, in order: "cold" (an empty cache folder: no compiled graphs and, on a CPU, no
built C++ operators, `engine/native.py`), "warm" (the same folder again: what a second
`wedlm generate` on this machine pays) and "eager" (`enforce_eager=True`).

    python benchmarks/first_call.py [--model models/wedlm-tiny] [--max-tokens 128] [--repeats 1]

The cache folder is a fresh temporary one ($WEDLM_CACHE, with TORCHINDUCTOR_CACHE_DIR inside it),
so "cold" is cold whatever ~/.cache/wedlm holds; it is deleted at the end. The C++ operators are
built while `LLM(...)` loads, so a cold "load s" includes their build. `--repeats N` runs the
cold / warm / eager triple N times with a new folder each time and prints every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = "Count from 1 to 40."


def child(model: str, max_tokens: int, eager: bool) -> dict:
    import time

    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    from wedlm import LLM, SamplingParams

    llm = LLM(model, device="cpu", **({"enforce_eager": True} if eager else {}))
    loaded = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompt = PROMPT
    if llm.tokenizer is not None and llm.tokenizer.chat_template:
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                   tokenize=False)
    times, text = [], None
    for _ in range(2):
        t0 = time.perf_counter()
        text = llm.generate([prompt], params)[0]["text"]
        times.append(time.perf_counter() - t0)
    compiled = llm.engine.runner.compiled
    from torch._dynamo.utils import counters

    cache = {k: v for group in ("inductor", "aot_autograd") for k, v in counters[group].items() if "cache" in k}
    return {"caches": cache, "load s": loaded - start, "first call s": times[0], "second call s": times[1],
            "graphs": compiled.graphs if compiled else 0, "compile s": compiled.compile_s if compiled else 0.0,
            "forward": "eager" if llm.engine.enforce_eager else "compiled", "text": text,
            "tokens": len(llm.tokenizer.encode(text)) if llm.tokenizer is not None else 0}


def run(model: str, max_tokens: int, cache: Path, eager: bool) -> dict:
    env = dict(os.environ, WEDLM_CACHE=str(cache), TORCHINDUCTOR_CACHE_DIR=str(cache / "torch-compile"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("WEDLM_ENFORCE_EAGER", None)  # the default configuration, not a test suite's
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model,
           "--max-tokens", str(max_tokens)] + (["--eager"] if eager else [])
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "wedlm-tiny"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.max_tokens, args.eager)))
        return 0
    keys = ("load s", "first call s", "second call s", "graphs", "compile s", "tokens")
    print(f"model {args.model}, one chat prompt ({PROMPT!r}), at most {args.max_tokens} tokens, one thread, "
          "fresh process per row")
    print("| run | process | forward | " + " | ".join(keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="wedlm-compile-cache-") as cache:
            rows = [(name, run(args.model, args.max_tokens, Path(cache), name == "eager"))
                    for name in ("cold", "warm", "eager")]
        texts = {r["text"] for _, r in rows}
        for name, r in rows:
            cells = [f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys]
            print(f"| {i + 1} | {name} | {r['forward']} | " + " | ".join(cells) + " |")
        if len(texts) != 1:
            print(f"texts differ between the processes: {texts}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
