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
