"""A real pretrained model, SmolLM2-135M-Instruct, decoded by this engine, transformers and llama.cpp.

    pip install gguf llama-cpp-python matplotlib     # llama-cpp-python builds llama.cpp: ~10 minutes on 2 cores
    python scripts/fetch_smollm2.py                  # the float32 folder and the original Q4_1 GGUF file
    python benchmarks/real_model_speed.py [--dir DIR] [--new-tokens 64] [--repeats 3] [--threads 1 2] [--out-dir docs]

Every system gets the same prompt token ids (chat prompts through the model's own chat template)
and decodes greedily a fixed number of new tokens, end-of-sequence ignored:

* engine `ar`, eager and compiled (`enforce_eager=False`), on the float32 folder, in float32;
* engine `ar`, compiled, on bf16 weights with float32 activations (`quantization="bf16"`: the
  engine's default for this model on a CPU with AVX512-BF16; the row is missing on other CPUs)
  and under bf16 autocast (`autocast=True`: on a CPU with bf16 units);
* engine `ar`, compiled (`LLM`'s default), on the Q4_1 GGUF file (dequantized to float32 at load:
  the same weights as the folder, so the same speed; batch 1 only);
* transformers `generate`, float32 (batch 8: left-padded, with an attention mask);
* llama.cpp (llama-cpp-python) on a float32 GGUF file (the Q4_1 file's tensors dequantized with
  `gguf`, its metadata and tokenizer copied: the folder's weights exactly), on a bf16 one (the
  same with every matrix rounded to bf16, what the engine's bf16 row reads) and on the original
  Q4_1 file; batch 1 only (the binding's `generate` decodes one sequence).

Batch 1 runs each of the first `--batch1-prompts` prompts alone; batch 8 runs all eight prompts
at once. Per system, batch and thread count (torch threads / llama.cpp `n_threads`; each thread
count runs in its own process, since a compiled graph keeps the thread count it was built with):

* decode ms per token: milliseconds per decode step after the first token (batch 8: one step
  makes one token of each of the 8 answers);
* whole-answer tokens/s: new tokens of all answers over the wall time of the call (prefill included);
* same tokens: how many answers equal transformers' batch-1 greedy answer token for token.

Medians of `--repeats` repeats; within a repeat the systems alternate. With `--out-dir` writes
real_model_speed.json, real_model_speed.md (table, command, machine, versions) and
img/real_model_speed.png. Nothing here is part of the package.

Raises:
    SystemExit: the model folder or GGUF file is missing, or transformers/gguf is not installed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from wedlm.bench.peer import PLAIN_BUFFERS_NOTE, extra_buffers_work, llama_load, llama_run
from wedlm.bench.report import page_header

PROMPTS = ["What is the capital of Japan?", "Write a haiku about the sea.",
           "Explain in two sentences why the sky is blue.", "Give me three tips for learning to cook.",
           "What is 12 times 7?", "Name four planets of the solar system.",
           "Summarise the plot of Romeo and Juliet.", "How do I boil an egg?"]
BATCHES = (1, 8)
# (key, label, batches it runs): the order of the table, the plot and the alternation within a repeat
SYSTEMS = [("engine_eager", "engine ar, eager (f32)", BATCHES),
           ("engine_compiled", "engine ar, compiled (f32)", BATCHES),
           ("engine_bf16w", "engine ar, compiled, bf16 weights", BATCHES),
           ("engine_bf16", "engine ar, compiled, bf16 autocast", BATCHES),
           ("engine_gguf", "engine ar, compiled, from the Q4_1 file (dequantized to f32)", (1,)),
           ("transformers", "transformers generate (f32)", BATCHES),
           ("llama_f32", "llama.cpp, f32 GGUF", (1,)),
           ("llama_bf16", "llama.cpp, bf16 GGUF", (1,)),
           ("llama_q4_1", "llama.cpp, original Q4_1 GGUF", (1,))]
LABELS = {k: label for k, label, _ in SYSTEMS}


def dequantized_gguf(src: Path, out: Path, bf16: bool = False) -> Path:
    """`src` with every tensor dequantized to float32 (`gguf.quants.dequantize`), its metadata,
    tokenizer and chat template copied; written to `out` (returned). About 540 MB for SmolLM2-135M.
    With `bf16` every matrix is then rounded to bf16 (vectors, the norms, stay float32, as
    llama.cpp's own bf16 files keep them)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type",
                                              "general.quantization_version"):
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype("float32")
        if bf16 and values.ndim == 2:
            kind = gguf.GGMLQuantizationType.BF16
            writer.add_tensor(t.name, gguf.quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def engine_call(llm, prompts: list[list[int]], n: int) -> dict:
    """One `generate` of all `prompts` together, `ar`, greedy, exactly `n` new tokens each."""
    from wedlm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, decoding="ar")
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    steps = [o["stats"]["decode_time_s"] / max(1, o["stats"]["decode_tokens"] - 1) for o in outs]
    return {"tokens": [o["token_ids"] for o in outs], "decode_ms": 1e3 * statistics.median(steps), "wall_s": wall}


class StepClock:
    """A transformers logits processor that records when each decode step's logits arrive."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def hf_call(model, prompts: list[list[int]], n: int, pad_id: int) -> dict:
    """One greedy `generate` of all `prompts` (left-padded), exactly `n` new tokens each."""
    from transformers import LogitsProcessorList

    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    clock = StepClock()
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=pad_id, logits_processor=LogitsProcessorList([clock]))
        wall = time.perf_counter() - start
    return {"tokens": out[:, width:].tolist(), "decode_ms": 1e3 * (clock.times[-1] - clock.times[0]) / max(1, n - 1),
            "wall_s": wall}


def llama_call(llm, prompts: list[list[int]], n: int) -> dict:
    """llama.cpp: `llama_run` (wedlm.bench.peer) on each prompt; batch 1 only."""
    (prompt,) = prompts
    start = time.perf_counter()
    r = llama_run(llm, prompt, n, set())
    return {"tokens": [r["tokens"]], "decode_ms": r["wall_ms_per_token"], "wall_s": time.perf_counter() - start,
            "eval_ms": r["eval_ms_per_token"]}


def load_systems(folder: Path, q4: Path, ggufs: dict[str, Path], threads: int, max_len: int) -> tuple[dict, set[str]]:
    """Every system of SYSTEMS, loaded (the bf16 engine row only on a CPU with bf16 units, the
    llama.cpp ones only if llama-cpp-python is installed; `ggufs`: the f32 and bf16 files by
    system key), and the keys of the llama.cpp ones loaded without extra CPU buffer types
    (`extra_buffers_work`)."""
    from transformers import AutoModelForCausalLM

    from wedlm import LLM
    from wedlm.hardware import cpu_has_bf16_units

    # autocast=False: float32 compute like the other rows (on a CPU with bf16 units the engine would
    # otherwise autocast a model this wide to bf16, and its tokens would part from transformers' at near-ties)
    kw = dict(max_model_len=max_len, max_num_seqs=8, dtype="float32", device="cpu", autocast=False)
    systems = {"engine_eager": LLM(str(folder), enforce_eager=True, **kw), "engine_compiled": LLM(str(folder), enforce_eager=False, **kw),
               "engine_gguf": LLM(str(q4), enforce_eager=False, **kw),
               "transformers": AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()}
    try:
        systems["engine_bf16w"] = LLM(str(folder), enforce_eager=False, **dict(kw, autocast=None, quantization="bf16"))
    except ValueError as err:  # a CPU without AVX512-BF16
        print(f"real_model_speed: {LABELS['engine_bf16w']}: n/a, {err}", file=sys.stderr)
    if cpu_has_bf16_units():
        systems["engine_bf16"] = LLM(str(folder), enforce_eager=False, **dict(kw, autocast=True))
    else:
        print(f"real_model_speed: {LABELS['engine_bf16']}: n/a, this CPU has no bf16 units", file=sys.stderr)
    systems["transformers"].generation_config.eos_token_id = None  # exactly n tokens, like the others
    try:
        import llama_cpp  # noqa: F401  (only whether it is installed)
    except ImportError:
        print("real_model_speed: llama-cpp-python is not installed; its rows are n/a", file=sys.stderr)
        return systems, set()
    plain = set()
    for key, path in (*ggufs.items(), ("llama_q4_1", q4)):
        extra = extra_buffers_work(path, threads)
        if not extra:
            print(f"real_model_speed: {LABELS[key]}: {PLAIN_BUFFERS_NOTE}", file=sys.stderr)
            plain.add(key)
        systems[key] = llama_load(path, threads, max_len, extra_buffers=extra)
    return systems, plain


def call(key: str, system, prompts: list[list[int]], n: int, pad_id: int) -> dict:
    if key.startswith("engine"):
        return engine_call(system, prompts, n)
    if key == "transformers":
        return hf_call(system, prompts, n, pad_id)
    return llama_call(system, prompts, n)


def one_repeat(key: str, system, prompt_sets: list[list[list[int]]], n: int, pad_id: int) -> dict:
    """All `prompt_sets` (one generate call each) through one system: the repeat's numbers."""
    runs = [call(key, system, ps, n, pad_id) for ps in prompt_sets]
    tokens = [t for r in runs for t in r["tokens"]]
    out = {"decode_ms": statistics.mean(r["decode_ms"] for r in runs),
           "tok_s": sum(map(len, tokens)) / sum(r["wall_s"] for r in runs), "tokens": tokens}
    if "eval_ms" in runs[0]:
        out["eval_ms"] = statistics.mean(r["eval_ms"] for r in runs)
    return out


def phase(a: argparse.Namespace) -> list[dict]:
    """Every (system, batch) row at `a.threads` (one count) threads, in this process."""
    from wedlm.engine.chat import encode_chat

    (threads,) = a.threads
    torch.set_num_threads(threads)
    folder, q4 = Path(a.dir) / "SmolLM2-135M-Instruct", Path(a.dir) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    max_len = 256 + a.new_tokens
    systems, plain = load_systems(folder, q4, {"llama_f32": Path(a.f32_gguf), "llama_bf16": Path(a.bf16_gguf)},
                                  threads, max_len)
    tokenizer = systems["engine_eager"].tokenizer
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sets = {1: [[p] for p in prompts[:a.batch1_prompts]], 8: [prompts]}
    # transformers' batch-1 answers: the reference of "same tokens" (also its warm-up)
    reference = [hf_call(systems["transformers"], [p], a.new_tokens, pad_id)["tokens"][0] for p in prompts]
    plan = [(key, b) for key, _, batches in SYSTEMS for b in batches if key in systems]
    for key, b in plan:  # warm-up: compiles the graphs for both batch sizes, fills caches
        start = time.perf_counter()
        call(key, systems[key], sets[b][0], a.new_tokens, pad_id)
        print(f"warm-up {key} batch {b}, {threads} thread(s): {time.perf_counter() - start:.1f} s", file=sys.stderr)
    runs: dict[tuple, list[dict]] = {kb: [] for kb in plan}
    for i in range(a.repeats):
        print(f"repeat {i + 1}/{a.repeats}, {threads} thread(s)", file=sys.stderr)
        for b in BATCHES:
            for key, bb in plan:
                if bb == b:
                    runs[(key, b)].append(one_repeat(key, systems[key], sets[b], a.new_tokens, pad_id))
    rows = []
    for (key, b), rs in runs.items():
        ref = reference[:a.batch1_prompts] if b == 1 else reference
        toks = rs[0]["tokens"]
        row = {"system": key, "batch": b, "threads": threads, "answers": len(toks),
               "new_tokens": a.new_tokens, "same": sum(t == r for t, r in zip(toks, ref)),
               "decode_ms": statistics.median(r["decode_ms"] for r in rs),
               "tok_s": statistics.median(r["tok_s"] for r in rs)}
        if "eval_ms" in rs[0]:
            row["eval_ms"] = statistics.median(r["eval_ms"] for r in rs)
        if key in plain:
            row["plain_buffers"] = True
        rows.append(row)
    return rows


def versions() -> dict:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import llama_cpp

        out["llama-cpp-python"] = llama_cpp.__version__
    except ImportError:
        out["llama-cpp-python"] = "not installed"
    return out


def machine() -> str:
    """lscpu's model name and whether the CPU has AVX-512 / AVX512-BF16 / AMX."""
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    name = fields.get("Model name", "unknown CPU").strip()
    flags = set(fields.get("Flags", "").split())
    has = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name}; {fields.get('CPU(s)', '?').strip()} CPUs; flags: {', '.join(has) or 'no avx2/avx512'}"


def table(rows: list[dict]) -> str:
    """Markdown: one line per (system, batch, threads); rows missing from `rows` read n/a."""
    out = ["| system | batch | threads | decode ms/token | whole-answer tok/s | same tokens as transformers |",
           "|---|---|---|---|---|---|"]
    by = {(r["system"], r["batch"], r["threads"]): r for r in rows}
    for threads in sorted({r["threads"] for r in rows}):
        for b in BATCHES:
            for key, label, batches in SYSTEMS:
                r = by.get((key, b, threads))
                if r is None:
                    why = "n/a (binding decodes one sequence)" if key.startswith("llama") and b != 1 else "n/a"
                    if b in batches or key.startswith("llama"):
                        out.append(f"| {label} | {b} | {threads} | {why} | n/a | |")
                    continue
                ms = f"{r['decode_ms']:.2f}" + (f" (C++ forward {r['eval_ms']:.2f})" if "eval_ms" in r else "")
                label += " *" if r.get("plain_buffers") else ""
                out.append(f"| {label} | {b} | {threads} | {ms} | {r['tok_s']:.1f} | {r['same']}/{r['answers']} |")
    return "\n".join(out) + "\n"


def ratios(rows: list[dict]) -> list[str]:
    """The targets: engine `ar` (the faster of eager/compiled, float32) >= 2x transformers and >=
    0.9x llama.cpp float32, batch 1, by decode ms per token, per thread count; then, where they
    ran, engine `ar` on bf16 weights and under bf16 autocast against llama.cpp on the bf16 file."""
    by = {(r["system"], r["batch"], r["threads"]): r for r in rows}
    lines = []
    for threads in sorted({r["threads"] for r in rows}):
        eng = [by[(k, 1, threads)] for k in ("engine_eager", "engine_compiled") if (k, 1, threads) in by]
        if not eng:
            continue
        best = min(eng, key=lambda r: r["decode_ms"])
        for peer, target in (("transformers", 2.0), ("llama_f32", 0.9)):
            p = by.get((peer, 1, threads))
            if p is None:
                continue
            speed = p["decode_ms"] / best["decode_ms"]
            verdict = "met" if speed >= target else "NOT met"
            lines.append(f"- {threads} thread(s), batch 1: {LABELS[best['system']]} is {speed:.2f}x "
                         f"{LABELS[peer]} per decoded token (target >= {target}x: {verdict})")
        theirs = by.get(("llama_bf16", 1, threads))
        for key in ("engine_bf16w", "engine_bf16"):
            ours = by.get((key, 1, threads))
            if ours and theirs:
                lines.append(f"- {threads} thread(s), batch 1: {LABELS[key]} is "
                             f"{theirs['decode_ms'] / ours['decode_ms']:.2f}x {LABELS['llama_bf16']} per decoded "
                             "token (the same bf16 matmul weights)")
    return lines


def markdown(result: dict) -> str:
    return "\n".join([
        *page_header("Real-model speed: SmolLM2-135M-Instruct", result),
        f"Greedy, {result['new_tokens']} new tokens per answer (end-of-sequence ignored), chat prompts through "
        f"the model's chat template, the same token ids for every system; batch 1 is {result['batch1_prompts']} "
        f"prompts one at a time, batch 8 is 8 prompts at once. Medians of {result['repeats']} repeats, the systems "
        "alternating within a repeat. Decode ms/token: per decode step after the first token (batch 8: a step "
        "makes one token of each answer; llama.cpp: wall clock through its Python binding, its own C++ forward "
        "counter in parentheses). Whole-answer tok/s: all new tokens over the call's wall time, prefill included. "
        "Same tokens: answers identical to transformers' batch-1 greedy answer. float32 rows use the same "
        "weights (the Q4_1 file dequantized); the engine computes in float32 from the Q4_1 file too. bf16 rows: "
        "the same matmul weights rounded to bf16 (the engine rounds them at load, llama.cpp reads a bf16 file, whose "
        "embedding table is bf16 too; the engine's stays float32).",
        "",
        table(result["rows"]),
        *([f"\\* {PLAIN_BUFFERS_NOTE}.", ""] if any(r.get("plain_buffers") for r in result["rows"]) else []),
        "Targets (batch 1):",
        "",
        *ratios(result["rows"]),
        "",
        "![decode ms per token](img/real_model_speed.png)",
        "",
    ])


def plot(rows: list[dict], path: Path) -> None:
    """Horizontal bars of decode ms per token, one group per (batch, threads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["batch"], r["threads"]) for r in rows})
    by = {(r["system"], r["batch"], r["threads"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(9, 2.2 + 0.9 * len(groups)))
    height = 0.8 / len(SYSTEMS)
    for i, (key, label, _) in enumerate(SYSTEMS):
        ys = [g + i * height for g in range(len(groups)) if (key, *groups[g]) in by]
        xs = [by[(key, *grp)]["decode_ms"] for grp in groups if (key, *grp) in by]
        ax.barh(ys, xs, height, label=label)
    ax.set_yticks([g + 0.4 - height / 2 for g in range(len(groups))])
    ax.set_yticklabels([f"batch {b}, {t} thread(s)" for b, t in groups])
    ax.invert_yaxis()
    ax.set_xlabel("decode ms per token (lower is faster)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)  # below: no bar hidden
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict, out_dir: Path) -> None:
    """real_model_speed.json, real_model_speed.md and img/real_model_speed.png under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "real_model_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "real_model_speed.md").write_text(markdown(result))
    plot(result["rows"], out_dir / "img" / "real_model_speed.png")


def parse() -> argparse.Namespace:
    from wedlm.model.source import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(cache_dir() / "smollm2"), help="scripts/fetch_smollm2.py's folder")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch1-prompts", type=int, default=3, choices=range(1, len(PROMPTS) + 1), metavar="1..8")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--f32-gguf", default=None, help=argparse.SUPPRESS)  # set for the per-thread processes
    ap.add_argument("--bf16-gguf", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rows-json", default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    a = parse()
    if a.rows_json:  # one thread count, in its own process
        Path(a.rows_json).write_text(json.dumps(phase(a)))
        return
    d = Path(a.dir)
    if not (d / "SmolLM2-135M-Instruct" / "config.json").is_file():
        raise SystemExit(f"real_model_speed: no SmolLM2 folder under {d}; run scripts/fetch_smollm2.py")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        q4 = d / "SmolLM2-135M-Instruct.Q4_1.gguf"
        f32 = dequantized_gguf(q4, Path(tmp) / "smollm2-f32.gguf")
        bf16 = dequantized_gguf(q4, Path(tmp) / "smollm2-bf16.gguf", bf16=True)
        for threads in a.threads:
            out = Path(tmp) / f"rows-{threads}.json"
            cmd = [sys.executable, __file__, "--dir", str(d), "--new-tokens", str(a.new_tokens), "--repeats",
                   str(a.repeats), "--batch1-prompts", str(a.batch1_prompts), "--threads", str(threads),
                   "--f32-gguf", str(f32), "--bf16-gguf", str(bf16), "--rows-json", str(out)]
            subprocess.run(cmd, check=True)
            rows += json.loads(out.read_text())
    args = " ".join(sys.argv[1:])
    result = {"command": f"python benchmarks/real_model_speed.py {args}".strip(), "machine": machine(),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "versions": versions(),
              "new_tokens": a.new_tokens, "repeats": a.repeats, "batch1_prompts": a.batch1_prompts, "rows": rows}
    print(markdown(result))
    if a.out_dir:
        write_outputs(result, Path(a.out_dir))


if __name__ == "__main__":
    main()
