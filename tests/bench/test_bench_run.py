"""A whole `wedlm bench` run on a tiny random WeDLM checkpoint: JSON schema, invariants, report files."""

import json

import pytest
import torch

from wedlm.bench.report import PLOTS, RESULT_KEYS, SCHEMA_KEYS, markdown, targets, write_report
from wedlm.bench.runner import BenchConfig, bench_systems, run_bench

MAX_TOKENS = 4
ITEMS = {"counting": (1, 2), "arithmetic": (1, 2), "listops": (1, 2), "code": (1, 2), "text": (1, 2)}


@pytest.fixture(scope="module")
def bench(ckpt_factory):
    """One run; a single torch thread (two threads on a shared 2-core box spin-wait 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = ckpt_factory("bench-wedlm", wedlm=True, tokenizer=True, vocab_size=260, max_position_embeddings=2048)
    cfg = BenchConfig(model=str(path), quick=True, taus=(0.4, 0.9), lambdas=(0.02,), blockwise_taus=(0.9,),
                      repeats=2, max_tokens=MAX_TOKENS, items=ITEMS, batch_sizes=(1, 2),
                      command="wedlm bench --test", progress=False)
    try:
        yield cfg, run_bench(cfg)
    finally:
        torch.set_num_threads(threads)


def test_top_level_schema(bench):
    cfg, result = bench
    assert tuple(result) == SCHEMA_KEYS
    assert result["schema"] == "wedlm-bench/1" and result["stop_by_ar"] is False and result["stop_in_run"] is False  # the test checkpoint: Algorithm 1
    assert result["command"] == "wedlm bench --test"
    assert result["machine"]["torch"] and result["machine"]["transformers"]
    assert "torch" in result["machine_line"] and "Python" in result["machine_line"]
    # the test suite pins BLAS matmuls (tests/conftest.py) and float32
    assert result["engine"]["matmuls"] == ("BLAS float32 matmuls (WEDLM_CPU_LINEAR=blas); "
                                          "one-row matmuls on transposed weight copies")
    assert result["engine"]["precision"].startswith("float32 weights, no autocast")
    assert result["engine"]["forward"] == "eager"  # the suite's WEDLM_ENFORCE_EAGER=1 (tests/conftest.py)
    assert [s["name"] for s in result["systems"]] == [
        "wedlm t=0.4 l=0.02", "wedlm t=0.9 l=0.02", "blockwise t=0.9", "verified", "ar", "transformers"]
    assert [t["name"] for t in result["tasks"]] == ["counting", "arithmetic", "listops", "code", "text"]
    assert result["tasks"][0]["items"] == {"1": 1, "2": 2}
    assert json.loads(json.dumps(result)) == result  # plain JSON types only


def test_one_row_per_task_batch_and_system(bench):
    cfg, result = bench
    rows = result["results"]
    assert len(rows) == 5 * 2 * 6  # tasks x batch sizes x systems
    keys = {(r["task"], r["batch_size"], r["system"]) for r in rows}
    assert len(keys) == len(rows)
    for r in rows:
        assert set(RESULT_KEYS) <= set(r), set(RESULT_KEYS) - set(r)
        assert r["items"] == cfg.n_items(r["task"], r["batch_size"])
        assert 0 < r["decode_tokens"] <= r["items"] * MAX_TOKENS
        assert r["tokens_per_s"] > 0 and r["wall_s"] > 0 and r["ttft_s"] > 0
        assert 0 < r["p_cache"] <= 1 and r["tokens_per_forward"] > 0
        assert len(r["repeats"]) == 2
        assert (r["accuracy"] is None) == (r["task"] in ("code", "text"))
        assert r["speedup_vs_ar"] > 0 and r["speedup_vs_transformers"] > 0


def test_reference_systems(bench):
    _, result = bench
    for r in result["results"]:
        if r["system"] == "ar":
            assert r["p_cache"] == 1.0 and r["tokens_per_forward"] == 1.0
            assert r["speedup_vs_ar"] == 1.0 and r["same_as_ar"] == 1.0
        if r["system"] == "transformers":
            assert r["speedup_vs_transformers"] == 1.0
            assert r["same_as_ar"] == 1.0  # invariant 4: greedy AR equals transformers generate
        if r["system"] == "verified":
            assert r["same_as_ar"] == 1.0  # invariant 5: lossless


def test_trace_is_the_first_counting_prompt(bench):
    _, result = bench
    trace = result["trace"]
    assert trace["task"] == "counting" and trace["batch_size"] == 1
    assert set(trace["commits"]) == {"wedlm t=0.4 l=0.02", "wedlm t=0.9 l=0.02", "blockwise t=0.9", "verified", "ar"}
    for name, commits in trace["commits"].items():
        row = [r for r in result["results"] if r["task"] == "counting" and r["batch_size"] == 1
               and r["system"] == name][0]
        assert sum(commits) == row["decode_tokens"]
    assert trace["commits"]["ar"] == [1] * len(trace["commits"]["ar"])


def test_targets_and_markdown(bench):
    _, result = bench
    checks = targets(result)
    claims = [t["claim"] for t in checks]
    assert claims[0] == "counting: wall clock vs ar"
    assert any("verified" in c for c in claims)
    assert all(isinstance(t["met"], bool) and t["target"] > 0 for t in checks)
    md = markdown(result)
    assert "`wedlm bench --test`" in md and result["machine_line"] in md
    assert md.count("| transformers |") == 10  # one row per task and batch size
    # the llama.cpp peer's page stays linked when docs/benchmarks.md is regenerated
    assert "[llama_cpp_peer.md](llama_cpp_peer.md)" in md and "wedlm bench --peer llama.cpp --out-dir docs" in md


def test_write_report_files(bench, tmp_path):
    _, result = bench
    paths = write_report(result, tmp_path)
    saved = json.loads(paths["json"].read_text())
    assert saved["results"] == result["results"] and saved["targets"] == targets(result)
    assert paths["markdown"].read_text().startswith("# Benchmarks")
    for name in PLOTS:
        data = (tmp_path / "img" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_systems_sweep_order():
    cfg = BenchConfig(model="m", taus=(0.2, 0.9), lambdas=(0.02, 0.1), lambda_tau=0.9, blockwise_taus=(0.9,))
    names = [s.name for s in bench_systems(cfg)]
    assert names == ["wedlm t=0.2 l=0.02", "wedlm t=0.9 l=0.02", "wedlm t=0.9 l=0.1", "blockwise t=0.9",
                     "verified", "ar", "transformers"]
    with pytest.raises(ValueError, match="unknown task"):
        BenchConfig(model="m", tasks=("poetry",))


def test_cli_writes_report(ckpt_factory, tmp_path, capsys):
    from wedlm.cli.main import main

    path = ckpt_factory("bench-wedlm", wedlm=True, tokenizer=True, vocab_size=260, max_position_embeddings=2048)
    threads = torch.get_num_threads()
    try:
        rc = main(["bench", "--model", str(path), "--quick", "--tasks", "counting", "--batch-sizes", "1",
                   "--max-tokens", "3", "--taus", "0.9", "--blockwise-taus", "0.9", "--no-transformers",
                   "--no-plots", "--threads", "1", "--out-dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    saved = json.loads((tmp_path / "benchmarks.json").read_text())
    assert [r["system"] for r in saved["results"]] == ["wedlm t=0.9 l=0.02", "blockwise t=0.9", "verified", "ar"]
    assert saved["machine"]["torch_threads"] == 1
    assert (tmp_path / "benchmarks.md").read_text().startswith("# Benchmarks")
    assert not (tmp_path / "img").exists()
    out = capsys.readouterr().out
    assert "counting: wall clock vs ar" in out and "markdown:" in out


def test_companion_pages_bring_their_first_table(tmp_path):
    from wedlm.bench.report import companion_lines, first_table

    (tmp_path / "real_model_speed.md").write_text("# T\n\nintro\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n| c |\n|---|\n")
    assert first_table((tmp_path / "real_model_speed.md").read_text()) == ["| a | b |", "|---|---|", "| 1 | 2 |"]
    lines = companion_lines(tmp_path)
    assert lines[0].startswith("## A real pretrained model") and lines[2:5] == ["| a | b |", "|---|---|", "| 1 | 2 |"]
    assert "[real_model_speed.md](real_model_speed.md)" in lines[6] and "| c |" not in lines
    assert companion_lines(None) == [] and first_table("no table\n") == []
    (tmp_path / "structured_outputs.md").write_text("# nothing tabular\n")
    assert sum(line.startswith("## ") for line in companion_lines(tmp_path)) == 1
