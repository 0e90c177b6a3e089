"""Every stage config the project ships parses into a valid TrainConfig."""

from pathlib import Path

import pytest
import yaml

from wedlm.train.config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_is_valid(path):
    cfg = TrainConfig(**yaml.safe_load(path.read_text()))
    assert cfg.max_steps >= 1 and cfg.out_dir


def test_there_are_configs():
    assert len(CONFIGS) >= 5


def _cfg(**kw):
    base = dict(stage="ar", data="d.jsonl", tokenizer="tok", out_dir="out", model={"hidden_size": 8})
    return TrainConfig(**{**base, **kw})


def test_yaml_exponent_without_dot_is_read_as_a_float(tmp_path):
    # PyYAML follows YAML 1.1: "5e-4" (no dot) loads as a string, which must not reach the optimizer.
    path = tmp_path / "c.yaml"
    path.write_text("stage: ar\ndata: d.jsonl\ntokenizer: tok\nout_dir: out\nmodel: {hidden_size: 8}\n"
                    "lr: 5e-4\nmin_lr: 5e-5\nmax_steps: 10\nwarmup_steps: '20'\n")
    assert yaml.safe_load(path.read_text())["lr"] == "5e-4"
    cfg = TrainConfig.from_yaml(path, {"weight_decay": "1e-2"})
    assert cfg.lr == 5e-4 and type(cfg.lr) is float
    assert cfg.min_lr == 5e-5 and cfg.weight_decay == 0.01
    assert cfg.warmup_steps == 20 and type(cfg.warmup_steps) is int
    assert _cfg(max_minutes=12).max_minutes == 12.0 and type(_cfg(max_minutes=12).max_minutes) is float


@pytest.mark.parametrize("key,value,match", [
    ("lr", "fast", "lr must be a number"),
    ("lr", True, "lr must be a number"),
    ("max_steps", 2.5, "max_steps must be a whole number"),
    ("seed", [1], "seed must be a number"),
    ("compile", "yes", "compile must be true or false"),
])
def test_bad_numeric_value_names_the_field(key, value, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**{key: value})


@pytest.mark.parametrize("key,value,match", [
    ("lr", -1e-3, r"lr must be > 0 and finite, got -0.001"),
    ("lr", 0, r"lr must be > 0 and finite, got 0.0"),
    ("lr", "nan", r"lr must be > 0 and finite, got nan"),
    ("min_lr", -1, r"min_lr must be >= 0 and finite, got -1.0"),
    ("weight_decay", "inf", r"weight_decay must be >= 0 and finite, got inf"),
    ("ar_weight", -0.5, r"ar_weight must be >= 0 and finite, got -0.5"),
    ("grad_clip", 0, r"grad_clip must be > 0 and finite, got 0.0"),
    ("init_std", -0.02, r"init_std must be > 0 and finite, got -0.02"),
    ("warmup_steps", -1, r"warmup_steps must be >= 0, got -1"),
    ("log_every", 0, r"log_every must be >= 1, got 0"),
    ("keep_checkpoints", 0, r"keep_checkpoints must be >= 1, got 0"),
    ("max_minutes", 0, r"max_minutes must be > 0 and finite \(or null\), got 0.0"),
    ("stop_after_steps", 0, r"stop_after_steps must be >= 1 \(or null\), got 0"),
    ("data_limit", -5, r"data_limit must be >= 1 \(or null\), got -5"),
    ("num_threads", 0, r"num_threads must be >= 1 \(or null\), got 0"),
])
def test_out_of_range_value_names_the_field_and_its_range(key, value, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**{key: value})


def test_zero_warmup_and_ar_weight_and_unset_limits_are_valid():
    cfg = _cfg(warmup_steps=0, ar_weight=0, min_lr=0, weight_decay=0, max_minutes=None, data_limit=None)
    assert (cfg.warmup_steps, cfg.ar_weight, cfg.min_lr, cfg.max_minutes) == (0, 0.0, 0.0, None)


def test_unknown_and_missing_keys_are_named(tmp_path):
    path = tmp_path / "stage.yaml"
    path.write_text("stage: wedlm\ndata: d.jsonl\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['learning_rat'\]"):
        TrainConfig.from_yaml(path)
    path.write_text("stage: wedlm\ndata: d.jsonl\n")
    with pytest.raises(ValueError, match=r"missing config key\(s\) \['tokenizer', 'out_dir'\] \(or --set KEY=VALUE\)"):
        TrainConfig.from_yaml(path)
    assert TrainConfig.from_yaml(path, {"tokenizer": "t", "out_dir": "o", "init": "i"}).out_dir == "o"
