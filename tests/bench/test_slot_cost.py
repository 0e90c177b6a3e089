"""The slot-cost section's mechanics on the tiny model with tiny sizes (no timing assertions)."""

import json

import pytest

from wedlm.bench.slot_cost import SlotCostConfig, break_even, run_slot_cost, write_slot_cost
from wedlm.cli.bench import slot_cost_config
from wedlm.cli.main import build_parser


def test_break_even_interpolates_between_points():
    curve = {1: 2.0, 4: 3.0, 16: 6.0}
    assert break_even(curve, 1) == 1.0
    assert break_even(curve, 4) == 1.5
    assert break_even(curve, 10) == 2.25  # halfway from 3.0 to 6.0 ms, over 2.0 ms
    assert break_even(curve, 64) == 3.0


def test_config_checks_name_the_field():
    with pytest.raises(ValueError, match="slots must be integers >= 1"):
        SlotCostConfig(models=("m",), slots=(0, 1))
    with pytest.raises(ValueError, match="modes must be"):
        SlotCostConfig(models=("m",), modes=("fast",))


def test_cli_quick_config():
    args = build_parser().parse_args(["bench", "--slot-cost", "--quick", "--model", "m", "--enforce-eager"])
    cfg = slot_cost_config(args)
    assert (cfg.models, cfg.slots, cfg.prefix, cfg.repeats, cfg.modes) == (("m",), (1, 4, 16), 128, 3, ("eager",))
    args = build_parser().parse_args(["bench", "--slot-cost", "--model", "m"])
    cfg = slot_cost_config(args)
    assert cfg.models == ("m", "random-40m", "random-150m") and cfg.slots == (1, 2, 4, 8, 16, 32, 64)
    assert cfg.modes == ("eager", "compiled") and cfg.prefix == 512


def test_tiny_run_writes_json_markdown_and_plot(tiny_wedlm, tmp_path):
    cfg = SlotCostConfig(models=(str(tiny_wedlm),), slots=(1, 2, 16), prefix=8, repeats=2, modes=("eager",),
                         window_size=4, tpf_prompts=1, tpf_max_tokens=8, progress=False)
    result = run_slot_cost(cfg)
    (row,) = result["rows"]
    assert row["mode"] == "eager" and row["window"] == 4 and row["compile_s"] == 0.0
    assert sorted(row["ms"]) == ["1", "16", "2"] and all(t > 0 for t in row["ms"].values())
    assert row["ratio_16_vs_1"] == row["ms"]["16"] / row["ms"]["1"]
    assert row["break_even"] == pytest.approx(break_even({int(k): v for k, v in row["ms"].items()}, 4))
    assert row["tokens_per_forward"] >= 1.0
    over = row["engine_overhead"]
    assert sorted(over) == ["ar", "wedlm"]
    assert over["ar"]["steps"] == 7  # 8 tokens, one per forward; the prefill forward is left out
    assert all(o["overhead"] > 0 and o["bare_ms"] > 0 for o in over.values())
    paths = write_slot_cost(result, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"][0]["ms"] == row["ms"]
    text = paths["markdown"].read_text()
    assert "| W=1 | W=2 | W=16 |" in text and "step/bare ar" in text and "bench_slot_cost.png" in text
    assert f"\n| {tiny_wedlm.name} | " in text and str(tiny_wedlm) not in text  # folders by their last part
    assert paths["plot"].stat().st_size > 0


def test_precision_table_and_plot_side_by_side(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "slot_cost_precisions", Path(__file__).resolve().parents[2] / "benchmarks" / "slot_cost_precisions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for label, ms in (("a", {"1": 10.0, "2": 12.0, "16": 20.0, "64": 40.0}), ("b", {"1": 8.0, "2": 6.0, "16": 10.0})):
        (tmp_path / label).mkdir()
        row = {"model": "random-40m", "mode": "eager", "ms": ms}
        (tmp_path / label / "slot_cost.json").write_text(
            json.dumps({"config": {"prefix": 512}, "machine_line": "cpu", "rows": [row]}))
    runs = mod.load([f"fp32={tmp_path / 'a'}", f"bf16={tmp_path / 'b'}"])
    rows = mod.table(runs).splitlines()[2:]
    assert rows == ["| random-40m | fp32 | eager | 10.00 | 12.00 | 20.00 | 40.00 | 2.00x | 2.00x |",
                    "| random-40m | bf16 | eager | 8.00 | 6.00 | 10.00 | - | 1.25x | 1.00x |"]
    mod.plot(runs, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="LABEL=DIR"):
        mod.load(["nolabel"])
