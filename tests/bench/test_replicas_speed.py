"""benchmarks/replicas_speed.py's statistics, server command lines and report on synthetic
numbers (no server, no model, no timing)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from wedlm.cli.main import build_parser
from wedlm.cli.serve import replica_spec, uses_ray

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("replicas_speed", REPO / "benchmarks" / "replicas_speed.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_percentile_matches_numpy_linear():
    bench = _bench()
    values = [0.31, 0.12, 0.5, 0.07, 0.9, 0.44, 0.23]
    for q in (0, 1, 25, 50, 90, 99, 100):
        assert bench.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)
    assert bench.percentile([3.0], 99) == 3.0
    assert bench.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    with pytest.raises(ValueError, match="no values"):
        bench.percentile([], 50)
    with pytest.raises(ValueError, match="q must be in 0..100"):
        bench.percentile([1.0], 101)


def test_summarize_rates_and_latencies():
    s = _bench().summarize([0.1, 0.2, 0.3, 0.4], [10, 20, 30, 40], wall=2.0)
    assert s["requests"] == 4 and s["tokens"] == 100
    assert s["req_s"] == 2.0 and s["tok_s"] == 50.0
    assert s["p50_ms"] == pytest.approx(250.0)
    assert s["p99_ms"] == pytest.approx(397.0)  # 0.3 + 0.97 * (0.4 - 0.3)
    assert s["mean_ms"] == pytest.approx(250.0)


def test_server_command_lines_are_what_wedlm_serve_means():
    """single runs without Ray, ray1 on Ray with one replica of 2 threads, ray2 two replicas of 1."""
    setups = {s.key: s for s in _bench().setups(2)}
    assert [s.threads for s in setups.values()] == [2, 2, 1]
    assert [s.label for s in setups.values()] == [
        "single process, 2 threads", "Ray Serve, 1 replica x 2 threads", "Ray Serve, 2 replicas x 1 thread"]
    threads = {}
    for key, setup in setups.items():
        args = build_parser().parse_args(["serve", *setup.args])
        assert uses_ray(args) is setup.ray
        if setup.ray:
            spec = replica_spec(args).fit_threads(2)
            assert spec.most_replicas == {"ray1": 1, "ray2": 2}[key]
            threads[key] = spec.threads
    assert threads == {"ray1": 2, "ray2": 1}


def test_prompts_alternate_tasks_from_the_split():
    bench = _bench()
    test, val = bench.prompts(6), bench.prompts(6, "val")
    assert len(test) == 6 and len(set(test)) == 6 and not set(test) & set(val)
    assert test[0].startswith("Count") and test[3].startswith("Count")
    assert test[1].startswith("What is") and test[4].startswith("What is")


def _row(key, label, req_s, p50, seq_p50, health, answers, left=()):
    conc = {"requests": 64, "wall_s": 64 / req_s, "req_s": req_s, "tok_s": 30 * req_s, "tokens": 1920,
            "p50_ms": p50, "p99_ms": 2 * p50, "mean_ms": p50}
    seq = {"requests": 2, "wall_s": 1.0, "req_s": 2.0, "tok_s": 60.0, "tokens": 60, "p50_ms": seq_p50,
           "p99_ms": seq_p50 + 10, "mean_ms": seq_p50}
    return {"key": key, "label": label, "threads": 2, "startup_s": 12.0, "replicas_line": "", "concurrent": conc,
            "sequential": seq, "health_ms": health, "replicas_used": 2 if key == "ray2" else 1, "answers": answers,
            "exit_code": 0, "stop_s": 1.0, "processes": 3, "left_running": list(left)}


ROWS = [_row("single", "single process, 2 threads", 4.0, 1500.0, 200.0, 1.5, ["a", "b", "c"]),
        _row("ray1", "Ray Serve, 1 replica x 2 threads", 3.2, 1800.0, 212.5, 4.0, ["a", "b", "x"]),
        _row("ray2", "Ray Serve, 2 replicas x 1 thread", 4.8, 1400.0, 300.0, 4.5, ["a", "b", "c"], left=[77])]


def test_report_table_and_findings(tmp_path):
    bench = _bench()
    rows = bench.compare(ROWS)
    assert [(r["same_answers"], r["answers"]) for r in rows] == [(3, 3), (2, 3), (3, 3)]
    lines = bench.table(rows).splitlines()
    assert lines[2] == "| single process, 2 threads | 4.00 | 120.0 | 1500 | 3000 | 200 | 210 | 1.5 | 1 | 3/3 | 12 | yes |"
    assert lines[3].startswith("| Ray Serve, 1 replica x 2 threads | 3.20 | 96.0 | 1800 |")
    assert lines[3].endswith("| 2/3 | 12 | yes |")
    assert lines[4].endswith("| 2 | 3/3 | 12 | no (exit 0, left [77]) |")
    assert bench.findings(rows, 8) == [
        "- Ray Serve proxy's added latency per request (sequential median, 1 replica - single process): "
        "+12.5 ms (+6%); on /health alone +2.5 ms (1.5 -> 4.0 ms).",
        "- At concurrency 8: 1 replica behind the proxy gives 0.80x the single process's requests/s, p50 +300 ms.",
        "- 2 replicas x 1 thread: 1.50x the requests/s of 1 replica x 2 threads.",
        "- 2 replicas x 1 thread: 1.20x the requests/s of the single process."]
    result = {"command": "python benchmarks/replicas_speed.py --out-dir docs", "machine": "Test CPU; 2 CPUs",
              "date": "2026-12-06 04:50 UTC", "versions": {"python": "3.11"}, "cpus": 2, "requests": 64,
              "concurrency": 8, "sequential": 2, "max_tokens": 64, "rows": rows}
    bench.write_outputs(result, tmp_path)
    assert json.loads((tmp_path / "replicas_speed.json").read_text()) == result
    md = (tmp_path / "replicas_speed.md").read_text()
    assert "`python benchmarks/replicas_speed.py --out-dir docs`" in md and "2026-12-06 04:50 UTC" in md
    assert lines[2] in md.splitlines() and "+12.5 ms (+6%)" in md


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as err:
        _bench().parse(["--concurrency", "0"])
    assert err.value.code == 2
    assert "--concurrency must be >= 1, got 0" in capsys.readouterr().err
