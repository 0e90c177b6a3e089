"""Write models/wedlm-tiny/README.md (the model card) from the evaluation's summary.json.

    python recipes/model_card.py --eval runs/wedlm-tiny/eval/summary.json --out models/wedlm-tiny/README.md

Every number in the card comes from the model folder (config.json, generation_config.json,
model.safetensors) or from the summary that recipes/eval_wedlm_tiny.py writes; the text around
them is fixed. The probe plots next to the summary are copied into the model folder's plots/.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVAL_CMD = "python recipes/eval_wedlm_tiny.py --n-count 200 --n-addsub 100 --n-listops 150 --probe-items 20"
TASK_NAMES = {"count": "counting", "addsub": "two-digit sums and differences", "listops": "list operations"}


def parameters(model: Path) -> int:
    """Number of parameters in model.safetensors (tied embeddings counted once)."""
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def eval_rows(s: dict) -> list[str]:
    """The evaluation table: one row per task of the test split, the held-out "Count from 1 to N."
    rows and the demo; columns AR / WeDLM / verified accuracy and WeDLM tokens per forward."""
    rows = ["| items | n | `ar` | `wedlm` | `verified` | `wedlm` tokens/forward |", "|---|---|---|---|---|---|"]
    tot = s["tasks_total"]
    for task, r in tot["ar"].items():
        w, v = tot["wedlm"][task], tot["verified"][task]
        rows.append(f"| test split: {TASK_NAMES.get(task, task)} | {r['n']} | {pct(r['accuracy'])} | "
                    f"{pct(w['accuracy'])} | {pct(v['accuracy'])} | {w['tokens_per_forward']:.2f} |")
    for split, label in (("test", "test"), ("val", "validation")):
        a, w = s["from_one"]["ar"][split], s["from_one"]["wedlm"][split]
        rows.append(f"| \"Count from 1 to N.\", N in 10..300, {label} keys | {a['n']} | {pct(a['exact'])} | "
                    f"{pct(w['exact'])} | - | {w['tokens_per_forward']:.2f} |")
    demo = s["count200"][f"W={s['window']}"]
    rows.append(f"| \"Count from 1 to 200.\" (a training prompt) | 1 | {_exact(demo['ar'])} | {_exact(demo['wedlm'])} | "
                f"{_exact(demo['verified'])} | {demo['wedlm']['tokens_per_forward']:.2f} "
                f"({demo['wedlm']['forwards']} forwards) |")
    return rows


def held_out_example(s: dict) -> int:
    """The smallest end N above 20 of a held-out "Count from 1 to N." that `ar` and `wedlm` both
    got right on the test keys (the card's second example); 42 when the summary has none."""
    from wedlm.data.curriculum import from_one_heldout

    wrong = {w["prompt"] for dec in ("ar", "wedlm") for w in s["from_one"][dec]["test"]["wrong"]}
    ends = [int(ex["prompt"][len("Count from 1 to "):-1]) for ex in from_one_heldout("test") if ex["prompt"] not in wrong]
    return next((n for n in ends if n > 20), 42)


def _exact(r: dict) -> str:
    return "exact" if r["exact"] else "wrong"


def card(s: dict, model: Path) -> str:
    cfg = json.loads((model / "config.json").read_text())
    from wedlm.engine.defaults import model_decoding_defaults

    gen = model_decoding_defaults(str(model))
    max_new = json.loads((model / "generation_config.json").read_text()).get("max_new_tokens", "the engine's")
    n_params = parameters(model)
    return TEMPLATE.format(
        params=f"{n_params / 1e6:.2f}M", hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"], kv=cfg["num_key_value_heads"], ffn=cfg["intermediate_size"],
        vocab=cfg["vocab_size"], ctx=cfg["max_position_embeddings"], window=gen["wedlm_window_size"],
        tau=gen["wedlm_entropy_threshold"], lam=gen["wedlm_pos_penalty_factor"],
        stops=stop_rule(gen), max_new=max_new, held_out=held_out_example(s), precision=f" ({s['precision'].split(' (')[0]})" if s.get("precision") else "",
        table="\n".join(eval_rows(s)), eval_cmd=EVAL_CMD, plots=plot_lines(s))


def stop_rule(gen: dict) -> str:
    """The card's words for the stop rule of the decoding defaults (docs/method.md)."""
    if not gen["wedlm_stop_by_ar"]:
        return "stops as in Algorithm 1"
    if gen["wedlm_stop_in_run"]:
        return "stops decided by the AR head or by a mask that closes a filled run"
    return "stops decided by the AR head"


def plot_lines(s: dict) -> str:
    """The mask probe's plots, when the evaluation drew them."""
    if not s.get("plots"):
        return ""
    return " The mask probe's plots:\n\n" + "\n".join(f"![{name[:-4].replace('_', ' ')}](plots/{name})"
                                                      for name in s["plots"])


TEMPLATE = """# wedlm-tiny

A {params}-parameter WeDLM (causal diffusion language model, arXiv 2512.22737) trained from
random weights on a 2-core CPU by `bash recipes/wedlm_tiny.sh`: AR training, conversion (adds
`[MASK]`), then WeDLM training with Dual-Stream Masking and the AR loss, at toy scale. It is the
default model of the demo, the tests and the benchmarks. Nothing was downloaded: the tokenizer and
every training example are generated by this repository.

It counts (up or down, steps 1/2/5/10, values 0..1100), adds and subtracts two-digit numbers, and
copies, reverses, sorts and edits short lists of names, answering one chat turn in the ChatML
format. On these answers streaming parallel decoding (`wedlm`) commits several tokens per forward.

| | |
|---|---|
| architecture | Qwen3-style decoder (RMSNorm, SwiGLU, GQA, RoPE, q/k norm), `model_type: wedlm` |
| size | hidden {hidden}, {layers} layers, {heads} heads / {kv} KV heads, FFN {ffn}, tied embeddings |
| vocabulary | {vocab} byte-level BPE tokens, one token per digit, ChatML template, `<\\|mask\\|>` |
| context | {ctx} positions |
| decoding defaults (`generation_config.json`) | window W={window}, entropy threshold tau={tau}, position penalty lambda={lam}, {stops}, at most {max_new} new tokens |

## Intended use

A model small enough to train, test and benchmark the engine on a laptop CPU: it exercises prefill,
streaming parallel decoding, the KV cache and the stop rules on answers whose right output is
known. It is not a general assistant.

## How to run

```bash
wedlm generate "Count from 1 to 200." --chat --max-tokens 1024
wedlm generate "Count from 1 to {held_out}." --chat --max-tokens 1024
wedlm generate "What is 47 + 38?" --chat
wedlm generate "Sort the list: Tom, Anna, Ben." --chat
```

```python
from wedlm import LLM, SamplingParams

llm = LLM(model="models/wedlm-tiny")
prompt = llm.tokenizer.apply_chat_template(
    [{{"role": "user", "content": "Count from 5 to 25 in steps of 5."}}], tokenize=False, add_generation_prompt=True)
out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=64))[0]
print(out["text"])  # 5, 10, 15, 20, 25
```

## Training data

The curriculum of `wedlm/data/curriculum.py`, drawn fresh for each stage: counting ("Count from A to
B.", "Count down from B to A.", steps 1/2/5/10, ranges that cross a change in the number of digits or
in which an earlier value ends like the end value), two-digit sums and differences ("What is A + B?"
-> "A + B = C"), and list operations on 3-6 names (copy, reverse, sort, insert, remove, replace).
Every example has a key; a stable hash of the key puts it in the train, validation or test split,
so no evaluated item is trained on. The demo prompt "Count from 1 to 200." falls in the train split,
so it is itself a training prompt (oversampled in the early stages, at its natural rate in the last
four). The last four stages add "Count from A to N." with small starts A and ends N up to 320, many
of them ending in 100..320, where only N's hundreds digit decides the stop. The "Count from 1 to N."
prompts evaluated below are the ends N in 10..300 whose keys fall in the test and validation splits.

## Training procedure

27 stages on 2 CPU cores: AR training of a 4-layer model, conversion, WeDLM stages that teach
reading the end value and stopping on every digit of it, growth to 8 layers, WeDLM stages with
suffix masking and random block offsets, then small-start ranges (the AR loss counted twice) and a
replay of every task at a low learning rate; bf16 autocast where the CPU has bf16 units. The recipe,
one config per stage and the stages table with minutes per stage are in
[docs/training.md](../../docs/training.md#reproducing-the-shipped-model).

## Evaluation

Held-out items, greedy decoding with the defaults above{precision}: `ar` decodes one token per
forward, `wedlm` is streaming parallel decoding, `verified` checks every parallel fill against the
AR head. Counting is scored on the whole answer, sums on the final number, lists on the items.

{table}

Reproduce with `{eval_cmd}`.{plots}

## Limitations

- Its misses on "Count from 1 to N." are the hundreds digit of N: it stops 100 early or runs on
  100 past N (the table above counts them).
- Only the tasks of its curriculum: other prompts, other wording, names outside its list of 16 or
  numbers outside the trained ranges give confident nonsense.
- Single-turn: it was trained on one user turn and one answer; a second turn in the same context
  is outside its training.
- Chat format only: a raw prompt without the ChatML template (`--chat`) gets no sensible answer.
- Errors cluster at the end of long ranges and where the number of digits changes; `wedlm` makes a
  few more of them than `ar` (see the table).

## Licence

Apache-2.0, like the rest of the repository.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval", default=str(REPO / "runs" / "wedlm-tiny" / "eval" / "summary.json"))
    p.add_argument("--model", default=str(REPO / "models" / "wedlm-tiny"))
    p.add_argument("--out", default=None, help="default: MODEL/README.md")
    args = p.parse_args(argv)
    summary_path, model = Path(args.eval), Path(args.model)
    summary = json.loads(summary_path.read_text())
    for name in summary.get("plots", []):
        (model / "plots").mkdir(exist_ok=True)
        shutil.copyfile(summary_path.parent / name, model / "plots" / name)
    out = Path(args.out or model / "README.md")
    out.write_text(card(summary, model))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
