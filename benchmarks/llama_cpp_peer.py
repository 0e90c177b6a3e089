"""The engine's `ar` against a C++ engine, llama.cpp, on the same weights: batch 1, greedy, one thread.

    pip install gguf llama-cpp-python      # builds llama.cpp from source: about 10 minutes on 2 cores
    python benchmarks/llama_cpp_peer.py [--model models/wedlm-tiny] [--max-tokens 256] [--repeats 3] [--out-dir docs]

Writes the model as a float32 GGUF file (`gguf`, llama.cpp's own writer package; the model's
tensors renamed to llama.cpp's `qwen3` or `qwen2` layout, its byte-level BPE vocabulary and
merges), then decodes the same prompts (token ids: no tokenizer differences) with
llama-cpp-python and with this engine (`ar`, eager and compiled), alternating, one torch / ggml
thread each, and prints per prompt (medians of the repeats) and their mean:

* the greedy tokens of both, and whether they are identical (same float32 weights; the kernels
  sum in different orders, so a near-tie could differ);
* decode milliseconds per token after the first: llama.cpp's own C++ counter (`t_eval_ms /
  n_eval` of `llama_perf_context`, the ggml forward alone) and its wall clock through the Python
  binding (sampling included), against this engine's `decode_time_s` per token (scheduler,
  metadata, forward, commit: the whole step);
* the ratios engine / llama.cpp (above 1: the engine is slower);

and with `--out-dir` writes them as JSON and markdown with a bar plot (img/llama_cpp_peer.png).

Nothing here is part of the package: llama.cpp is a peer to measure against.

Raises:
    SystemExit: `gguf` or `llama_cpp` is not installed, or the model is not a Qwen2/Qwen3-style
        checkpoint this writer knows (see `gguf_arch`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

# HF tensor name (after "model.layers.N.") -> llama.cpp's GGUF name (after "blk.N.")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
PROMPTS = ["Count from 1 to 200.", "Count from 37 to 90.", "Count down from 150 to 80.",
           "Reverse the list: Tom, Anna, Ben, Mia.", "What is 47 + 38?"]


def gguf_arch(config: dict) -> str:
    """llama.cpp's architecture for a config: `qwen3` (q/k norm, no q/k/v bias) or `qwen2` (bias, no norm).

    Raises:
        SystemExit: any other combination, or a RoPE scaling this writer does not carry.
    """
    qk_norm = config.get("qk_norm", config.get("model_type") == "qwen3")
    bias = config.get("attention_bias", config.get("model_type") == "qwen2")
    if config.get("rope_scaling"):
        raise SystemExit("llama_cpp_peer: rope_scaling is not written to GGUF by this script")
    if qk_norm and not bias:
        return "qwen3"
    if bias and not qk_norm:
        return "qwen2"
    raise SystemExit(f"llama_cpp_peer: no llama.cpp architecture for qk_norm={qk_norm}, attention_bias={bias}")


def write_gguf(model_dir: Path, out: Path) -> Path:
    """The checkpoint in `model_dir` as one float32 GGUF file at `out` (returned; the shipped model:
    16 MB, 90 tensors).

    The vocabulary, merges and special tokens are written so that llama.cpp loads the file; its
    pre-tokenizer is declared as `qwen2`, which splits text close to but not exactly like this
    project's tokenizers (digits one by one, then GPT-2's byte-level rule), so compare on token ids,
    as `main` does, not on text.

    Raises:
        SystemExit: an architecture `gguf_arch` does not know, a tokenizer that is not byte-level
            BPE, or a tensor with no llama.cpp name.
    """
    import gguf

    from wedlm.tokenizer import load_tokenizer, stop_token_ids

    config = json.loads((model_dir / "config.json").read_text())
    arch = gguf_arch(config)
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE":
        raise SystemExit("llama_cpp_peer: only byte-level BPE tokenizers are written")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(model_dir.name)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tok["model"]["vocab"]
    size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    # llama.cpp's eos: the smallest of the model's stop ids, by the engine's own rule (the benchmark
    # stops on the engine's stop ids itself, so this only has to be one of them)
    stops = stop_token_ids(load_tokenizer(model_dir), model_dir)
    if stops:
        w.add_eos_token_id(stops[0])
    w.add_add_bos_token(False)
    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    for name, t in sorted(tensors.items()):
        if name in TOP_NAMES:
            gname = TOP_NAMES[name]
        elif name.startswith("model.layers."):
            idx, rest = name[len("model.layers."):].split(".", 1)
            if rest not in LAYER_NAMES:
                raise SystemExit(f"llama_cpp_peer: no llama.cpp name for tensor {name}")
            gname = f"blk.{idx}.{LAYER_NAMES[rest]}"
        else:
            raise SystemExit(f"llama_cpp_peer: unexpected tensor {name}")
        w.add_tensor(gname, t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def llama_run(llm, prompt: list[int], max_tokens: int, stops: set[int]) -> dict:
    """Greedy decode with llama-cpp-python; C++ eval time from llama.cpp's own counters."""
    import llama_cpp

    llm.reset()
    ctx = llm._ctx.ctx  # the raw llama_context the perf counters take (llama-cpp-python 0.3 keeps it here)
    llama_cpp.llama_perf_context_reset(ctx)
    out, first_at = [], None
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if first_at is None:
            first_at = time.perf_counter()
        out.append(tok)
        if tok in stops or len(out) >= max_tokens:
            break
    end = time.perf_counter()
    perf = llama_cpp.llama_perf_context(ctx)
    n_later = max(1, len(out) - 1)
    return {"tokens": out, "wall_ms_per_token": 1e3 * (end - first_at) / n_later,
            "eval_ms_per_token": perf.t_eval_ms / max(1, perf.n_eval)}


def engine_run(llm, prompt: list[int], max_tokens: int) -> dict:
    """Greedy `ar` with this engine; decode time per token after the first (the whole step)."""
    from wedlm import SamplingParams

    o = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, decoding="ar"))[0]
    s = o["stats"]
    return {"tokens": o["token_ids"], "ms_per_token": 1e3 * s["decode_time_s"] / max(1, s["decode_tokens"] - 1)}


def table(rows: list[dict], version: str, repeats: int) -> str:
    """The markdown table of `main`'s rows (one per prompt, then the mean)."""
    out = [f"engine `ar` vs llama.cpp ({version}), batch 1, one thread, float32, medians of {repeats}; "
           "ms per decoded token after the first", "",
           "| prompt | tokens | same tokens | llama.cpp C++ forward | llama.cpp with its binding | engine eager | "
           "engine compiled | compiled / C++ forward | compiled / with binding |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "" if r["same"] is None else ("yes" if r["same"] else "NO")
        out.append(f"| {r['prompt']} | {r['tokens'] or ''} | {same} | {r['llama eval']:.3f} | {r['llama wall']:.3f} | "
                   f"{r['eager']:.3f} | {r['compiled']:.3f} | {r['compiled'] / r['llama eval']:.2f}x | "
                   f"{r['compiled'] / r['llama wall']:.2f}x |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """Grouped bars: ms per token of llama.cpp (C++ forward), engine compiled and eager, per prompt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [("llama eval", "llama.cpp (C++ forward)"), ("compiled", "engine ar, compiled"), ("eager", "engine ar, eager")]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / len(systems)
    for i, (key, label) in enumerate(systems):
        ax.bar([j + i * width for j in range(len(rows))], [r[key] for r in rows], width, label=label)
    ax.set_xticks([j + width for j in range(len(rows))])
    ax.set_xticklabels([r["prompt"] if len(r["prompt"]) < 24 else r["prompt"][:22] + "..." for r in rows], fontsize=7)
    ax.set_ylabel("ms per decoded token (batch 1, 1 thread)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/wedlm-tiny")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gguf", default=None, help="where to write the GGUF file (default: a temporary folder)")
    ap.add_argument("--out-dir", default=None,
                    help="also write llama_cpp_peer.json, llama_cpp_peer.md and img/llama_cpp_peer.png here")
    a = ap.parse_args()
    try:
        import gguf  # noqa: F401  (write_gguf's writer)
        import llama_cpp
    except ImportError:
        raise SystemExit("llama_cpp_peer: pip install gguf llama-cpp-python") from None
    from wedlm import LLM
    from wedlm.engine.chat import encode_chat

    torch.set_num_threads(1)
    model_dir = Path(a.model)
    tmp = tempfile.TemporaryDirectory()
    path = write_gguf(model_dir, Path(a.gguf) if a.gguf else Path(tmp.name) / "model-f32.gguf")
    peer = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_batch=512, n_threads=1, n_threads_batch=1,
                           verbose=False)
    engines = {"eager": LLM(model=str(model_dir), enforce_eager=True), "compiled": LLM(model=str(model_dir), enforce_eager=False)}
    tokenizer = engines["eager"].tokenizer
    stops = set(engines["eager"].engine.stop_ids)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    for llm in engines.values():  # warm-up: compiles the graphs, fills caches
        for p in prompts:
            engine_run(llm, p, a.max_tokens)
    for p in prompts:
        llama_run(peer, p, a.max_tokens, stops)
    keys = ("llama eval", "llama wall", "eager", "compiled")
    rows = []
    for text, p in zip(PROMPTS, prompts):
        cell = {k: [] for k in keys}
        same = True
        for _ in range(a.repeats):
            lr = llama_run(peer, p, a.max_tokens, stops)
            cell["llama eval"].append(lr["eval_ms_per_token"])
            cell["llama wall"].append(lr["wall_ms_per_token"])
            for name, llm in engines.items():
                er = engine_run(llm, p, a.max_tokens)
                cell[name].append(er["ms_per_token"])
                same = same and er["tokens"] == lr["tokens"]
        rows.append({"prompt": text, "tokens": len(er["tokens"]), "same": same,
                     **{k: statistics.median(v) for k, v in cell.items()}})
    rows.append({"prompt": "mean", "tokens": None, "same": None,
                 **{k: statistics.mean(r[k] for r in rows) for k in keys}})
    md = table(rows, llama_cpp.__version__, a.repeats)
    print(md)
    if a.out_dir:
        out = Path(a.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "llama_cpp_peer.json").write_text(json.dumps({"llama_cpp": llama_cpp.__version__, "model": str(model_dir),
                                                             "repeats": a.repeats, "max_tokens": a.max_tokens,
                                                             "rows": rows}, indent=1) + "\n")
        (out / "llama_cpp_peer.md").write_text(md)
        plot(rows[:-1], out / "img" / "llama_cpp_peer.png")


if __name__ == "__main__":
    main()
