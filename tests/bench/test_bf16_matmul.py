"""benchmarks/bf16_matmul.py: the model's matmul shapes, and a run on the shipped model where the
CPU multiplies bf16 panels."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_shapes_are_the_models_matmuls():
    config = json.loads((REPO / "models" / "wedlm-tiny" / "config.json").read_text())
    mats = runpy.run_path(str(REPO / "benchmarks" / "bf16_matmul.py"))["shapes"](config)
    # hidden 192, 4 heads x 48 (q 192), 2 KV heads (k, v 96 each), intermediate 512, 8 layers, vocab 4096
    assert mats[:4] == [(384, 192), (192, 192), (1024, 192), (192, 512)]
    assert len(mats) == 4 * 8 + 1 and mats[-1] == (4096, 192)


def test_a_run_prints_one_line_per_row_count():
    from wedlm.engine.fast_model import bf16_panels_supported, use_native_ops

    if not (use_native_ops() and bf16_panels_supported()):
        pytest.skip("needs a CPU with AVX512-BF16")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bf16_matmul.py"), "--model",
                          str(REPO / "models" / "wedlm-tiny"), "--rows", "1,3", "--passes", "1"],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    lines = out.splitlines()
    assert lines[0].startswith("| rows | bf16 panels (ms) |") and len(lines) == 4
    assert lines[2].startswith("| 1 | ") and lines[3].startswith("| 3 | ") and lines[3].endswith("% |")
