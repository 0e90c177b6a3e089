"""Trainer: loss falls, resume continues the same curve, 2 gloo processes = 1 process (same global batch)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from wedlm.model import load_model
from wedlm.train.config import TrainConfig
from wedlm.train.trainer import train

REPO = Path(__file__).resolve().parents[2]


def read_log(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def test_ar_and_wedlm_losses_fall(make_cfg, train_env, tmp_path):
    out = tmp_path / "ar"
    final = train(TrainConfig(**make_cfg(out, stage="ar", max_steps=30, model={
        **make_cfg(out)["model"], "model_type": "qwen3"})))
    log = read_log(out)
    assert log[-1]["ar_loss"] < 0.6 * log[0]["ar_loss"]
    assert load_model(final).config.model_type == "qwen3"
    out2 = tmp_path / "wedlm"
    train(TrainConfig(**make_cfg(out2, max_steps=20)))
    log = read_log(out2)
    first, last = log[0], log[-1]
    assert first["mask_loss"] > 0 and last["mask_loss"] < 0.8 * first["mask_loss"]
    assert last["ar_loss"] < 0.8 * first["ar_loss"]


def test_sft_chat_stage_runs_and_a_stage_from_it_records_the_lineage(make_cfg, train_env, tmp_path):
    first = train(TrainConfig(**make_cfg(tmp_path / "one", data=train_env["chat"], max_steps=3)))
    assert (first / "model.safetensors").is_file()
    meta = json.loads((first / "config.json").read_text())["wedlm_training"]
    log = read_log(tmp_path / "one")
    assert (meta["run"], meta["steps"], meta["lineage"]) == ("one", 3, [])
    assert meta["tokens"] == log[-1]["tokens"]
    assert meta["ar_loss"] == pytest.approx(sum(r["ar_loss"] for r in log) / 3, abs=1e-5)
    second = train(TrainConfig(**make_cfg(tmp_path / "two", data=train_env["chat"], max_steps=2, init=str(first))))
    meta2 = json.loads((second / "config.json").read_text())["wedlm_training"]
    assert meta2["run"] == "two" and meta2["steps"] == 2
    assert meta2["lineage"] == [{k: v for k, v in meta.items() if k != "lineage"}]


def test_resume_continues_same_curve(make_cfg, train_env, tmp_path):
    straight = tmp_path / "straight"
    train(TrainConfig(**make_cfg(straight)))
    resumed = tmp_path / "resumed"
    train(TrainConfig(**make_cfg(resumed, stop_after_steps=4)))
    assert not (resumed / "final").exists() and len(read_log(resumed)) == 4
    train(TrainConfig(**make_cfg(resumed)))
    a, b = read_log(straight), read_log(resumed)
    assert [r["step"] for r in b] == list(range(1, 9))
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) < 1e-5, (x, y)
    wa = load_model(straight / "final").state_dict()
    wb = load_model(resumed / "final").state_dict()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)


def test_end_step_finishes_early_on_the_full_schedule(make_cfg, train_env, tmp_path):
    straight = tmp_path / "straight"
    train(TrainConfig(**make_cfg(straight, max_steps=6)))
    early = tmp_path / "early"
    final = train(TrainConfig(**make_cfg(early, max_steps=6, end_step=3)))
    a, b = read_log(straight), read_log(early)
    assert [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a[:3], b):  # same learning rates (cosine over 6 steps) and losses
        assert x["lr"] == y["lr"] and abs(x["loss"] - y["loss"]) < 1e-5, (x, y)
    assert json.loads((final / "config.json").read_text())["wedlm_training"]["steps"] == 3
    with pytest.raises(ValueError, match="end_step"):
        TrainConfig(**make_cfg(tmp_path / "bad", max_steps=6, end_step=7))


def test_two_gloo_processes_match_one(make_cfg, train_env, tmp_path):
    """Global batch 4 rows: 1 process x 2 rows x 2 accumulation steps vs 2 processes x 2 rows."""
    one = tmp_path / "one"
    train(TrainConfig(**make_cfg(one, max_steps=4)))
    two = tmp_path / "two"
    cfg_file = tmp_path / "two.yaml"
    cfg_file.write_text(yaml.safe_dump(make_cfg(two, max_steps=4, grad_accum=1, num_threads=1)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "wedlm.cli.main", "train", "--config", str(cfg_file)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = read_log(one), read_log(two)
    assert len(a) == len(b) == 4
    for x, y in zip(a, b):
        assert x["tokens"] == y["tokens"]
        assert abs(x["loss"] - y["loss"]) < 1e-4, (x, y)


@pytest.mark.parametrize("key, raised, kept", [("end_weight", "ar_loss", "mask_loss"),
                                                ("mask_end_weight", "mask_loss", "ar_loss")])
def test_end_weights_raise_only_their_own_loss(make_cfg, train_env, tmp_path, key, raised, kept):
    """end_weight weights the AR head's stop, mask_end_weight the masked end targets; neither
    touches the other stream's loss, and a weight <= 0 is refused by name."""
    base = dict(data=train_env["chat"], max_steps=1, log_every=1)
    train(TrainConfig(**make_cfg(tmp_path / "plain", **base)))
    train(TrainConfig(**make_cfg(tmp_path / "weighted", **{key: 25.0}, **base)))
    plain, weighted = read_log(tmp_path / "plain")[0], read_log(tmp_path / "weighted")[0]
    assert weighted[kept] == pytest.approx(plain[kept], rel=1e-5)
    assert weighted[raised] > plain[raised] * 1.01
    with pytest.raises(ValueError, match=key):
        TrainConfig(**make_cfg(tmp_path / "bad", **{key: 0.0}))


def test_cpu_bf16_training_caps_the_onednn_primitive_cache(make_cfg, train_env, tmp_path):
    """Under CPU bf16 autocast the trainer caps oneDNN's primitive cache (memory grew with every
    row shape otherwise), unless the user set it; fp32 runs leave the environment alone. Each run
    is its own process (accelerate fixes the precision once per process)."""
    def env_after(name, precision, preset=None):
        cfg = tmp_path / f"{name}.json"
        cfg.write_text(json.dumps(make_cfg(tmp_path / name, max_steps=1, mixed_precision=precision)))
        code = ("import json, os, sys; from wedlm.train.config import TrainConfig; from wedlm.train.trainer import train; "
                "train(TrainConfig(**json.load(open(sys.argv[1])))); "
                "print('CAP=' + os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY', 'unset'))")
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
        if preset:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = preset
        out = subprocess.run([sys.executable, "-c", code, str(cfg)], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]

    assert env_after("fp32", "no") == "CAP=unset"
    assert env_after("bf16", "bf16") == "CAP=16"
    assert env_after("bf16b", "bf16", preset="64") == "CAP=64"


@pytest.mark.slow
def test_compiled_forward_follows_the_eager_curve_and_saves_plain_weights(make_cfg, train_env, tmp_path):
    """`compile: true` trains the same model: per-step losses within float tolerance of eager
    (fp32 on every CPU), and final/ holds the plain module's weights (the same names, no
    `_orig_mod.` prefixes), loadable as usual."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    train(TrainConfig(**make_cfg(eager, max_steps=4, mixed_precision="no")))
    train(TrainConfig(**make_cfg(compiled, max_steps=4, mixed_precision="no", compile=True)))
    for x, y in zip(read_log(eager), read_log(compiled), strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-5), (x, y)
    wa = load_model(eager / "final").state_dict()
    wb = load_model(compiled / "final").state_dict()
    assert wa.keys() == wb.keys()


def test_random_block_offset_reaches_the_draw_and_refuses_flex(make_cfg, train_env, tmp_path):
    """`random_block_offset` changes the mask draw of a step (same seed, same rows), and the flex
    path, which derives blocks from positions alone, is refused by name."""
    base = dict(data=train_env["chat"], max_steps=1, log_every=1)
    train(TrainConfig(**make_cfg(tmp_path / "fixed", **base)))
    train(TrainConfig(**make_cfg(tmp_path / "shifted", random_block_offset=True, **base)))
    fixed, shifted = read_log(tmp_path / "fixed")[0], read_log(tmp_path / "shifted")[0]
    assert fixed["tokens"] == shifted["tokens"]
    assert shifted["mask_loss"] != pytest.approx(fixed["mask_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="random_block_offset"):
        TrainConfig(**make_cfg(tmp_path / "bad", random_block_offset=True, attention="flex"))


def test_docs_cache_cut_short_leaves_no_cache(make_cfg, tmp_path, monkeypatch):
    """A tokenised-docs save interrupted half way (Ctrl-C) must not leave a docs.pt the resumed
    run would fail to load; the next run rebuilds it."""
    import types

    from wedlm.tokenizer import load_tokenizer
    from wedlm.train.trainer import load_docs

    cfg = TrainConfig(**make_cfg(tmp_path / "run"))
    tok = load_tokenizer(cfg.tokenizer)
    accelerator = types.SimpleNamespace(wait_for_everyone=lambda: None)
    save = torch.save

    def cut_short(obj, path):
        Path(path).write_bytes(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", cut_short)
    with pytest.raises(KeyboardInterrupt):
        load_docs(cfg, tok, True, accelerator)
    assert not (cfg.run_dir / "docs.pt").exists()
    monkeypatch.setattr(torch, "save", save)
    docs = load_docs(cfg, tok, True, accelerator)
    assert len(docs) == 60 and (cfg.run_dir / "docs.pt").is_file()
    assert [d.ids for d in load_docs(cfg, tok, True, accelerator)] == [d.ids for d in docs]  # from the cache
