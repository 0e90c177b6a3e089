"""recipes/smollm2_wedlm.py end to end at smoke size (8 self-distilled prompts, 1 SFT step): the
converted model and the trained one load, `verified` decoding equals `ar` on every held-out prompt
before and after (float32, lossless), and the measurements are written. Marked `real` (needs the
SmolLM2 fixture; minutes on 2 CPU cores)."""

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "recipes"))
from fetch_smollm2 import FOLDER_NAME, default_dir  # noqa: E402

if not (default_dir() / FOLDER_NAME / "config.json").is_file():
    pytest.skip("no SmolLM2 fixture: run python scripts/fetch_smollm2.py", allow_module_level=True)


def test_recipe_smoke(tmp_path, capsys):
    from smollm2_wedlm import main

    out = tmp_path / "run"
    assert main(["--out", str(out), "--prompts", "8", "--held-out", "2", "--steps", "1", "--max-tokens", "16"]) == 0
    train = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    assert len(train) == 8 and all(r["messages"][1]["content"] for r in train)
    results = json.loads((out / "results.json").read_text())
    for stage in ("before", "after"):
        assert results[stage]["verified"]["same_as_ar"] == results[stage]["verified"]["answers"] == 2
        # a measured figure, not a target: a mask head one SFT step old may fill far slots with
        # the stop token (Algorithm 1's stops), which ends an answer at its first token in two
        # forwards (0.5 a forward); a window commits at most 2 W = 32 tokens a forward
        assert 0 < results[stage]["wedlm"]["tokens_per_forward"] <= 32
    assert json.loads((out / "sft" / "final" / "config.json").read_text())["wedlm_training"]["steps"] == 1
    assert "| after 1 SFT steps |" in capsys.readouterr().out
