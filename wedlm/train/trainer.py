"""The training loop on HF `accelerate`: AR pretraining and WeDLM dual-stream training/SFT.

What: `train(cfg)` runs one stage to `cfg.max_steps` optimizer steps with AdamW,
linear warmup + cosine decay, gradient clipping, gradient accumulation and
data parallelism through `accelerate` (gloo on CPU, NCCL on GPU; FSDP/DeepSpeed
come from accelerate's own config file), bf16 on GPU when asked. It writes
`log.jsonl` (one JSON object per optimizer step logged), resumable checkpoints
under `checkpoints/step_N` (model, optimiser and RNG via `accelerator.save_state`,
plus `trainer_state.json` with the step and elapsed time, which fix the data
position and the LR schedule) and the final HF checkpoint under `final/`.

Why this shape: every row of the global batch has a global index; its packing
and its mask draw depend only on (seed, index). So a resumed run, or the same
global batch split over 1 or 2 processes or several accumulation steps, sees
the same data and - with losses normalised by global totals (losses.py) - the
same gradients.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from wedlm.hardware import cpu_model, training_precision
from wedlm.model import DenseAttention, ModelConfig, QwenForCausalLM, atomic_write, load_model, save_model
from wedlm.tokenizer import load_tokenizer

from .attention import ChunkedDualStreamAttention
from .config import TrainConfig
from .data import chat_end_id, load_documents
from .losses import LossSums, combine, first_end_weights, loss_sums, scored_indices
from .masking import DualStreamExample, build_causal, build_dual_stream, collate, draw_masks
from .packing import Packer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja")


def progress(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    """Fraction of the stage done: step / max_steps, or the wall-clock fraction of max_minutes
    when `schedule_by_time` is set and that is larger (the stage then ends on time, annealed)."""
    p = step / cfg.max_steps
    if cfg.schedule_by_time and cfg.max_minutes:
        p = max(p, elapsed_s / (60 * cfg.max_minutes))
    return min(1.0, p)


def learning_rate(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    """Linear warmup over `warmup_steps`, then cosine from cfg.lr down to cfg.min_lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    start = cfg.warmup_steps / cfg.max_steps
    t = max(0.0, (progress(cfg, step, elapsed_s) - start) / max(1e-9, 1 - start))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


ONEDNN_CPU_BF16_CACHE = 16  # oneDNN primitive cache entries under CPU bf16 training (see train())


def init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) for linear and embedding weights, zero biases (norm weights stay 1)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def build_model(cfg: TrainConfig, tokenizer) -> QwenForCausalLM:
    """Load `cfg.init`, or make a fresh model from `cfg.model` (+ the tokenizer's mask/eos ids)."""
    if cfg.init:
        model = load_model(cfg.init, dtype="float32")
    else:
        fields = dict(cfg.model)
        vocab = tokenizer.get_vocab()
        fields.setdefault("eos_token_id", [vocab[t] for t in ("<|endoftext|>", "<|im_end|>") if t in vocab])
        if fields.get("model_type") == "wedlm":
            fields.setdefault("mask_token_id", vocab.get("<|mask|>"))
        model = QwenForCausalLM(ModelConfig(**fields))
        torch.manual_seed(cfg.seed)
        init_weights(model, cfg.init_std)
    if cfg.stage == "wedlm" and model.config.mask_token_id is None:
        raise ValueError(f"{cfg.init}: WeDLM training needs a mask_token_id; run `wedlm convert` first")
    return model.train()


def row_example(cfg: TrainConfig, packer: Packer, index: int, mask_id: int | None) -> DualStreamExample:
    """Training row `index` of the run: AR row or dual-stream row with a mask draw seeded by the index."""
    row = packer.row(index)
    if cfg.stage == "ar":
        return build_causal(row)
    gen = torch.Generator().manual_seed(cfg.seed * 7_919 + index)
    draw = draw_masks(row, cfg.block_size, gen, cfg.suffix_mask_prob, cfg.random_block_offset)
    return build_dual_stream(row, draw, cfg.block_size, mask_id, cfg.first_mask_weight)


def micro_batches(cfg: TrainConfig, packer: Packer, step: int, rank: int, world: int,
                  mask_id: int | None) -> list[DualStreamExample]:
    """This process's micro-batches of optimizer step `step` (global row ids are split by rank)."""
    per_step = world * cfg.micro_batch * cfg.grad_accum
    out = []
    for m in range(cfg.grad_accum):
        first = step * per_step + (m * world + rank) * cfg.micro_batch
        out.append(collate([row_example(cfg, packer, first + j, mask_id) for j in range(cfg.micro_batch)]))
    return out


def attention_for(cfg: TrainConfig, batch: DualStreamExample):
    """Attention metadata of a batch: the chunked path, the dense reference, or FlexAttention."""
    if cfg.attention == "dense":
        return DenseAttention(batch.attention_mask)
    if cfg.attention == "flex":
        from .flex import FlexDualStreamAttention
        return FlexDualStreamAttention.from_positions(batch.position_ids, cfg.seq_len, cfg.block_size)
    return ChunkedDualStreamAttention(batch.attention_mask, stream_len=cfg.seq_len,
                                      block_size=cfg.block_size, chunk=cfg.chunk)


def forward_sums(model, cfg: TrainConfig, batch: DualStreamExample, device, end_id: int | None = None) -> LossSums:
    """Forward one micro-batch; logits only at scored slots. With an `end_id`: the AR loss of
    the first end token after each answer counts `cfg.end_weight` times, and the mask loss of
    every masked slot whose target is the end token `cfg.mask_end_weight` times."""
    batch = DualStreamExample(*(t.to(device) for t in batch))
    idx = scored_indices(batch.labels)
    logits = model(batch.input_ids, batch.position_ids, attention_for(cfg, batch), idx)
    is_memory = torch.zeros_like(batch.labels, dtype=torch.bool)
    is_memory[:, : cfg.seq_len] = True
    ar_weights = None
    if cfg.end_weight != 1.0 and end_id is not None:
        ar_weights = torch.ones_like(batch.loss_weights)
        ar_weights[:, : cfg.seq_len] = first_end_weights(batch.labels[:, : cfg.seq_len], end_id, cfg.end_weight)
    mask_weights = None
    if cfg.mask_end_weight != 1.0 and end_id is not None:
        mask_weights = torch.where((batch.labels == end_id) & ~is_memory, float(cfg.mask_end_weight), 1.0)
    return loss_sums(logits, batch.labels, batch.loss_weights, is_memory, ar_weights, mask_weights)


class Checkpoints:
    """`run_dir/checkpoints/step_N`; a checkpoint is complete once its trainer_state.json exists."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        self.root, self.keep = run_dir / "checkpoints", keep

    def latest(self) -> Path | None:
        done = [p for p in self.root.glob("step_*") if (p / "trainer_state.json").is_file()]
        return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)

    def save(self, accelerator, step: int, state: dict) -> None:
        path = self.root / f"step_{step}"
        accelerator.save_state(str(path))
        if accelerator.is_main_process:
            (path / "trainer_state.json").write_text(json.dumps(state, indent=2))
            done = sorted((p for p in self.root.glob("step_*") if (p / "trainer_state.json").is_file()),
                          key=lambda p: int(p.name.split("_")[1]))
            for old in done[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()


def load_docs(cfg: TrainConfig, tokenizer, is_main: bool, accelerator):
    """Tokenised documents, cached in run_dir/docs.pt (built by the main process)."""
    cache = cfg.run_dir / "docs.pt"
    if is_main and not cache.is_file():
        docs = load_documents(cfg.data, tokenizer, cfg.data_format, cfg.data_limit, cfg.source_limits,
                               cfg.num_learnable_im_end, cfg.data_skip)
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        # written whole or not at all: a save cut short (Ctrl-C) would leave a cache the next run cannot load
        atomic_write(cache, lambda path: torch.save([(d.ids, d.maskable) for d in docs], path))
    accelerator.wait_for_everyone()
    from .packing import Document
    return [Document(ids, m) for ids, m in torch.load(cache)]


def train(cfg: TrainConfig) -> Path:
    """Run (or resume) one stage; returns the folder of the final HF checkpoint.

    Skips straight to the result when `run_dir/final/config.json` already exists.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    final = cfg.run_dir / "final"
    if (final / "config.json").is_file():
        return final
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    cpu = not torch.cuda.is_available()
    precision = training_precision(cfg.mixed_precision, cuda=not cpu)
    if cpu and precision == "bf16":
        # oneDNN keeps a primitive per bf16 matmul shape (up to 1,024 by default); the varying
        # shapes of dual-stream rows grew a 4-layer run by ~20 MB per step (1.1 -> 2.0 GB in
        # 40 steps) and an 8-layer one to 9.5 GB. 16 kept it flat at the fp32 level, same losses.
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CPU_BF16_CACHE))
    accelerator = Accelerator(cpu=cpu, mixed_precision=precision)
    accelerator.print(f"precision: {'bf16 autocast' if precision == 'bf16' else 'fp32'} on "
                      f"{'CUDA' if not cpu else 'CPU ' + cpu_model()}")
    set_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.tokenizer)
    docs = load_docs(cfg, tokenizer, accelerator.is_main_process, accelerator)
    packer = Packer(docs, cfg.seq_len, tokenizer.pad_token_id or 0, cfg.seed)
    model = build_model(cfg, tokenizer)
    mask_id = model.config.mask_token_id
    model_config = model.config
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    # The LR schedule is a function of (step, elapsed) kept in trainer_state.json, so no scheduler
    # object is checkpointed (and none is prepared: accelerate steps those once per process).
    model, optimizer = accelerator.prepare(model, optimizer)
    # `forward_model` runs the steps; `model` (the prepared module) is what checkpoints save.
    # torch.compile wraps the same parameters, so the optimizer and the saved state are unchanged.
    forward_model = torch.compile(model, dynamic=True) if cfg.compile else model

    ckpts = Checkpoints(cfg.run_dir, cfg.keep_checkpoints)
    state = {"step": 0, "tokens": 0, "elapsed_s": 0.0}
    latest = ckpts.latest()
    if latest is not None:
        accelerator.load_state(str(latest))
        state = json.loads((latest / "trainer_state.json").read_text())
        accelerator.print(f"resumed from {latest} at step {state['step']}")
    if accelerator.is_main_process:
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        (cfg.run_dir / "train_config.json").write_text(json.dumps(
            {**cfg.to_dict(), "precision_ran": precision, "cpu": cpu_model() if cpu else None}, indent=2))
    state["precision"] = precision
    run_loop(cfg, accelerator, forward_model, optimizer, packer, mask_id, ckpts, state, chat_end_id(tokenizer))
    if stage_done(cfg, state):
        save_final(cfg, accelerator, model, model_config, state)
    return final


def step_once(cfg, accelerator, model, optimizer, packer, mask_id, step, lr, end_id=None) -> dict:
    """One optimizer step at learning rate `lr` over all micro-batches; returns global loss statistics."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    batches = micro_batches(cfg, packer, step, accelerator.process_index, accelerator.num_processes, mask_id)
    totals = torch.tensor([sum(float(b.loss_weights.sum()) for b in batches),
                           sum(float((b.labels[:, : cfg.seq_len] != -100).sum()) for b in batches)],
                          device=accelerator.device)
    total_w, total_ar = accelerator.reduce(totals, "sum").tolist()
    world = accelerator.num_processes
    sums = torch.zeros(2, device=accelerator.device)
    for i, batch in enumerate(batches):
        ctx = accelerator.no_sync(model) if i < len(batches) - 1 else _null()
        with ctx, accelerator.autocast():
            s = forward_sums(model, cfg, batch, accelerator.device, end_id)
            loss = combine(s, total_w, total_ar, cfg.ar_weight, cfg.loss_mix) * world  # DDP averages
        accelerator.backward(loss)
        sums += torch.stack([s.mask_ce.detach(), s.ar_ce.detach()])
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mask_ce, ar_ce = accelerator.reduce(sums, "sum").tolist()
    mask_loss = mask_ce / total_w if total_w > 0 else 0.0
    ar_loss = ar_ce / max(total_ar, 1.0)
    clean = world * cfg.grad_accum * cfg.micro_batch * cfg.seq_len
    scale = 0.5 if cfg.loss_mix == "mean" else 1.0
    return {"loss": scale * (mask_loss + cfg.ar_weight * ar_loss), "mask_loss": mask_loss, "ar_loss": ar_loss,
            "grad_norm": float(grad_norm), "tokens": clean}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_loop(cfg, accelerator, model, optimizer, packer, mask_id, ckpts, state, end_id=None) -> None:
    """Steps from state["step"] to max_steps with logging, checkpoints and the wall-clock guard."""
    log = cfg.run_dir / "log.jsonl"
    bar = tqdm(total=cfg.max_steps, initial=state["step"], disable=not accelerator.is_main_process,
               dynamic_ncols=True, mininterval=5.0, desc=f"{cfg.stage} {cfg.run_dir.name}")
    start, start_elapsed, start_tokens = time.time(), state["elapsed_s"], state["tokens"]
    first_step = state["step"]
    while not stage_done(cfg, state):
        lr = learning_rate(cfg, state["step"], state["elapsed_s"])
        stats = step_once(cfg, accelerator, model, optimizer, packer, mask_id, state["step"], lr, end_id)
        state["step"] += 1
        state["tokens"] += stats["tokens"]
        state["elapsed_s"] = start_elapsed + time.time() - start
        tok_s = (state["tokens"] - start_tokens) / max(1e-9, time.time() - start)
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.3f}", tok_s=f"{tok_s:.0f}", refresh=False)
        last = stage_done(cfg, state) or (cfg.max_minutes is not None and state["elapsed_s"] > 60 * cfg.max_minutes)
        if accelerator.is_main_process and (state["step"] % cfg.log_every == 0 or state["step"] == 1 or last):
            record = {"step": state["step"], **{k: round(v, 5) for k, v in stats.items() if k != "tokens"},
                      "lr": lr, "tokens": state["tokens"], "tok_s": round(tok_s, 1),
                      "elapsed_s": round(state["elapsed_s"], 1)}
            with open(log, "a") as f:
                f.write(json.dumps(record) + "\n")
        out_of_time = cfg.max_minutes is not None and state["elapsed_s"] > 60 * cfg.max_minutes
        if state["step"] < cfg.max_steps and out_of_time:
            state["ended_by"] = "time"  # schedule_by_time: annealed on time; else the wall-clock guard
            accelerator.print(f"stage ends on its wall-clock budget at step {state['step']}")
        pause = cfg.stop_after_steps is not None and state["step"] - first_step >= cfg.stop_after_steps
        if state["step"] % cfg.save_every == 0 or stage_done(cfg, state) or pause:
            ckpts.save(accelerator, state["step"], state)
        if pause and not stage_done(cfg, state):
            accelerator.print(f"stopping after {cfg.stop_after_steps} steps at step {state['step']} (resumable)")
            break
    bar.close()


def stage_done(cfg: TrainConfig, state: dict) -> bool:
    """True once the stage is over: max_steps (or end_step) reached, or ended on its wall clock."""
    return state["step"] >= (cfg.end_step or cfg.max_steps) or state.get("ended_by") == "time"


def final_losses(log: Path, last: int = 5) -> dict:
    """{"ar_loss", "mask_loss"}: means over the last `last` records of a stage's log.jsonl
    (keys absent from the log, or no log, are left out)."""
    if not log.is_file():
        return {}
    tail = [json.loads(x) for x in log.read_text().splitlines() if x.strip()][-last:]
    return {k: sum(r[k] for r in tail) / len(tail) for k in ("ar_loss", "mask_loss")
            if tail and all(k in r for r in tail)}


def lineage(init: str | None) -> list[dict]:
    """The training stages behind the checkpoint `init`, oldest first, from its config.json.

    Each finished stage writes its own record (`wedlm_training`) plus the lineage of the weights
    it started from, so an exported model carries its whole history even after the `runs/`
    folders of earlier stages are gone. Empty for a random init or a checkpoint without records.
    """
    if not init or not (Path(init) / "config.json").is_file():
        return []
    meta = json.loads((Path(init) / "config.json").read_text()).get("wedlm_training")
    if not meta:
        return []
    own = {k: v for k, v in meta.items() if k != "lineage"}
    return [*meta.get("lineage", []), own]


def save_final(cfg, accelerator, model, model_config, state) -> None:
    """Write final/ (config.json, model.safetensors, tokenizer files) from the main process."""
    if accelerator.is_main_process:
        final = cfg.run_dir / "final"
        unwrapped = accelerator.unwrap_model(model)
        record = {"stage": cfg.stage, "run": cfg.run_dir.name, "data": str(cfg.data), "steps": state["step"],
                  "tokens": state["tokens"], "elapsed_s": round(state["elapsed_s"]),
                  "ended_by": state.get("ended_by", "steps"), "precision": state.get("precision", "no"),
                  **final_losses(cfg.run_dir / "log.jsonl")}
        extra = {"wedlm_training": {**record, "lineage": lineage(cfg.init)}}
        save_model(unwrapped, final, extra)
        for name in TOKENIZER_FILES:
            src = Path(cfg.tokenizer) / name
            if src.is_file():
                shutil.copy(src, final / name)
    accelerator.wait_for_everyone()
