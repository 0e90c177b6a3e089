"""The training quick start (recipes/quickstart_train.sh) runs end to end with a few steps:
curriculum, training from the shipped model, and a generation from the trained checkpoint."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_trains_and_the_result_generates(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "STEPS": "2", "OUT": str(tmp_path / "qs"),
           "DATA": str(tmp_path / "data")}
    done = subprocess.run(["bash", str(REPO / "recipes" / "quickstart_train.sh")], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    final = tmp_path / "qs" / "final"
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
    assert f"trained checkpoint: {final}" in done.stdout
    assert "1, 2, 3, 4, 5, 6, 7, 8, 9, 10" in done.stdout  # two small steps keep the shipped model's counting
