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
