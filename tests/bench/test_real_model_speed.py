"""benchmarks/real_model_speed.py's table, targets and plot on synthetic numbers (no model, no timing)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("real_model_speed", REPO / "benchmarks" / "real_model_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(system, batch, threads, ms, tok_s, same, answers=3, **extra):
    return {"system": system, "batch": batch, "threads": threads, "answers": answers, "new_tokens": 64,
            "same": same, "decode_ms": ms, "tok_s": tok_s, **extra}


ROWS = [_row("engine_eager", 1, 1, 20.0, 45.0, 3), _row("engine_compiled", 1, 1, 16.0, 55.5, 3),
        _row("transformers", 1, 1, 40.0, 22.25, 3), _row("llama_f32", 1, 1, 16.0, 60.0, 2, eval_ms=15.5),
        _row("engine_compiled", 8, 1, 30.0, 250.0, 7, answers=8), _row("engine_eager", 1, 2, 12.0, 70.0, 3),
        _row("transformers", 1, 2, 30.0, 30.0, 3), _row("llama_f32", 1, 2, 10.0, 90.0, 3, eval_ms=9.0)]


def test_table_rows_and_missing_cells():
    md = _bench().table(ROWS)
    lines = md.splitlines()
    assert lines[0].startswith("| system | batch | threads | decode ms/token |")
    assert "| engine ar, compiled (f32) | 1 | 1 | 16.00 | 55.5 | 3/3 |" in lines
    assert "| llama.cpp, f32 GGUF | 1 | 1 | 16.00 (C++ forward 15.50) | 60.0 | 2/3 |" in lines
    assert "| engine ar, compiled (f32) | 8 | 1 | 30.00 | 250.0 | 7/8 |" in lines
    assert "| llama.cpp, f32 GGUF | 8 | 1 | n/a (binding decodes one sequence) | n/a | |" in lines
    assert "| transformers generate (f32) | 8 | 2 | n/a | n/a | |" in lines
    # the Q4_1 engine row exists at batch 1 only: no batch-8 line for it
    assert not any(line.startswith("| engine ar, compiled, from the Q4_1") and "| 8 |" in line for line in lines)
    assert "| engine ar, compiled, bf16 autocast | 8 | 2 | n/a | n/a | |" in lines
    assert "| engine ar, compiled, bf16 weights | 8 | 2 | n/a | n/a | |" in lines
    assert "| llama.cpp, bf16 GGUF | 1 | 1 | n/a | n/a | |" in lines
    assert len(lines) == 2 + 2 * (9 + 8)  # header, then per thread count: 9 systems at batch 1, 8 at batch 8


def test_targets_use_the_faster_engine_mode():
    lines = _bench().ratios(ROWS)
    assert lines == [
        "- 1 thread(s), batch 1: engine ar, compiled (f32) is 2.50x transformers generate (f32) per decoded token "
        "(target >= 2.0x: met)",
        "- 1 thread(s), batch 1: engine ar, compiled (f32) is 1.00x llama.cpp, f32 GGUF per decoded token "
        "(target >= 0.9x: met)",
        "- 2 thread(s), batch 1: engine ar, eager (f32) is 2.50x transformers generate (f32) per decoded token "
        "(target >= 2.0x: met)",
        "- 2 thread(s), batch 1: engine ar, eager (f32) is 0.83x llama.cpp, f32 GGUF per decoded token "
        "(target >= 0.9x: NOT met)"]


def test_bf16_engine_against_bf16_llama_cpp():
    """Where the bf16 rows ran, a line after the targets compares each engine row with llama.cpp's
    bf16 row (no target): bf16 weights first, then bf16 autocast."""
    rows = [*ROWS, _row("engine_bf16", 1, 1, 8.0, 110.0, 2), _row("llama_bf16", 1, 1, 20.0, 50.0, 2, eval_ms=19.0),
            _row("engine_bf16w", 1, 1, 10.0, 100.0, 3)]
    lines = _bench().ratios(rows)
    assert lines[2:4] == ["- 1 thread(s), batch 1: engine ar, compiled, bf16 weights is 2.00x llama.cpp, bf16 GGUF "
                          "per decoded token (the same bf16 matmul weights)",
                          "- 1 thread(s), batch 1: engine ar, compiled, bf16 autocast is 2.50x llama.cpp, bf16 GGUF "
                          "per decoded token (the same bf16 matmul weights)"]
    assert len(lines) == 6


def test_outputs_written(tmp_path):
    bench = _bench()
    result = {"command": "python benchmarks/real_model_speed.py --out-dir docs", "machine": "Test CPU; 2 CPUs",
              "date": "2026-01-01", "versions": {"torch": "0"}, "new_tokens": 64, "repeats": 3,
              "batch1_prompts": 3, "rows": ROWS}
    bench.write_outputs(result, tmp_path)
    md = (tmp_path / "real_model_speed.md").read_text()
    assert md.splitlines()[2] == ("Regenerate with: `python benchmarks/real_model_speed.py --out-dir docs` "
                                  "(generated file; do not edit).")
    assert "Machine: Test CPU; 2 CPUs. Date: 2026-01-01. torch 0." in md
    assert "Medians of 3 repeats" in md and "(target >= 0.9x: NOT met)" in md
    assert json.loads((tmp_path / "real_model_speed.json").read_text())["rows"] == ROWS
    assert (tmp_path / "img" / "real_model_speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_of_llama_cpp_without_extra_buffers_are_marked(tmp_path):
    """A llama.cpp system loaded without its extra CPU buffer types (its default crashed) carries
    a star in the table, and the page says why under it; pages without such rows do not."""
    bench = _bench()
    rows = [*ROWS, _row("llama_q4_1", 1, 1, 9.0, 100.0, 1, eval_ms=8.8, plain_buffers=True)]
    assert "| llama.cpp, original Q4_1 GGUF * | 1 | 1 | 9.00 (C++ forward 8.80) | 100.0 | 1/3 |" in bench.table(rows)
    result = {"command": "c", "machine": "m", "date": "d", "versions": {}, "new_tokens": 64, "repeats": 3,
              "batch1_prompts": 3, "rows": rows}
    assert f"\\* {bench.PLAIN_BUFFERS_NOTE}." in bench.markdown(result)
    assert "ggml-org/llama.cpp#20824" not in bench.markdown(dict(result, rows=ROWS))


@pytest.mark.parametrize("bf16", [False, True])
def test_dequantized_gguf_copies_metadata(tmp_path, bf16):
    """Every tensor dequantized to float32, metadata and tokenizer copied; with `bf16` the matrices
    rounded to bf16 and the vectors kept in float32."""
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_block_count(1)
    w.add_token_list(["a", "b", "c"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    weight = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf.GGUFReader(str(_bench().dequantized_gguf(src, tmp_path / "f.gguf", bf16=bf16)))
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["llama.block_count"].contents() == 1
    assert reader.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "c"]
    kinds = gguf.GGMLQuantizationType
    assert reader.fields["general.file_type"].contents() == (gguf.LlamaFileType.MOSTLY_BF16 if bf16
                                                             else gguf.LlamaFileType.ALL_F32)
    got = {t.name: t for t in reader.tensors}
    assert got["blk.0.attn_q.weight"].tensor_type == (kinds.BF16 if bf16 else kinds.F32)
    assert got["output_norm.weight"].tensor_type == kinds.F32
    q = gguf.quants.dequantize(got["blk.0.attn_q.weight"].data, got["blk.0.attn_q.weight"].tensor_type)
    assert q.shape == (2, 64)
    np.testing.assert_allclose(q, weight, atol=1 / 127 + (2 ** -8 if bf16 else 0))  # Q8_0: one scale per 32
    np.testing.assert_array_equal(np.asarray(got["output_norm.weight"].data), np.arange(4, dtype=np.float32))
