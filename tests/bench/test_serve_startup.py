"""benchmarks/serve_startup.py: a real `wedlm serve` process, timed to ready and through its first
requests (eager here: the compiled configurations compile for a minute)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "wedlm-tiny"


def _module():
    spec = importlib.util.spec_from_file_location("serve_startup", REPO / "benchmarks" / "serve_startup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_eager_server_is_timed_through_its_first_requests(tmp_path):
    bench = _module()
    row = bench.measure(str(MODEL), "eager", tmp_path, max_tokens=8)
    assert row["config"] == "eager" and 0 < row["ready s"] < 120
    assert row["first answers"] == row["steady answers"] and row["first answers"][0].startswith("1, 2, 3")
    assert len(row["first n=2 answers"]) == 2 and row["first n=2 answers"][0] == row["first n=2 answers"][1]
    lines = bench.table([row]).splitlines()
    assert lines[0] == "| config | ready s | first s | first n=2 s | steady s |"
    assert lines[2].startswith("| eager | ") and len(lines) == 3


def test_an_unknown_configuration_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        _module().main(["--configs", "warm,hot"])
    assert done.value.code == 2
    assert "--configs takes a comma-separated subset of cold,warm,eager, got 'warm,hot'" in capsys.readouterr().err
