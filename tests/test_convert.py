"""`wedlm convert`: a Qwen2/Qwen3 AR checkpoint becomes a WeDLM checkpoint the engine loads
(Llama-family sources: tests/model/test_llama_convert.py).

Weights must be byte-identical; config gets model_type wedlm, the family's
attention flags and mask_token_id; the tokenizer gains `<|mask|>` when missing.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wedlm.cli.main import main
from wedlm.convert import ConvertError, convert
from wedlm.model import load_model
from wedlm.testing import make_hf_checkpoint


@pytest.mark.parametrize("family,bias,qk_norm", [("qwen3", False, True), ("qwen2", True, False)])
def test_convert_keeps_weights_and_sets_config(tmp_path, family, bias, qk_norm):
    src = make_hf_checkpoint(tmp_path / "src", family=family, tokenizer=True, vocab_size=260)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst)]) == 0
    raw = json.loads((dst / "config.json").read_text())
    assert raw["model_type"] == "wedlm" and raw["attention_bias"] is bias and raw["qk_norm"] is qk_norm
    assert raw["mask_token_id"] == 259  # byte_tokenizer's <|mask|>
    assert (dst / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    a, b = load_model(src), load_model(dst)
    assert b.config.is_wedlm and b.config.mask_token_id == 259
    ids = torch.arange(10)[None]
    from wedlm.model import DenseAttention
    assert torch.equal(a(ids, ids, DenseAttention()), b(ids, ids, DenseAttention()))


def test_convert_adds_mask_token(tmp_path):
    from transformers import AutoTokenizer

    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", tokenizer=True, vocab_size=270)
    tok = AutoTokenizer.from_pretrained(str(src))
    # rebuild the tokenizer without <|mask|>: drop it from the saved tokenizer.json
    data = json.loads((src / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|mask|>"]
    (src / "tokenizer.json").write_text(json.dumps(data))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("mask_token", None)
    cfg.pop("added_tokens_decoder", None)
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert len(tok) == 260
    dst = convert(src, tmp_path / "dst")
    new_tok = AutoTokenizer.from_pretrained(str(dst))
    mask_id = json.loads((dst / "config.json").read_text())["mask_token_id"]
    assert new_tok.convert_ids_to_tokens(mask_id) == "<|mask|>" and mask_id < 270


def test_convert_rejects_bad_inputs(tmp_path):
    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", tokenizer=True, vocab_size=260)
    with pytest.raises(ConvertError):
        convert(src, src)
    raw = json.loads((src / "config.json").read_text())
    raw["model_type"] = "gpt2"
    (src / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConvertError, match="gpt2"):
        convert(src, tmp_path / "dst")


def test_converted_checkpoint_loads_in_engine(tmp_path):
    engine = pytest.importorskip("wedlm.engine.llm")
    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", tokenizer=True, vocab_size=260)
    dst = convert(src, tmp_path / "dst")
    from wedlm import SamplingParams

    llm = engine.LLM(model=str(dst))
    for decoding in ("ar", "wedlm"):
        out = llm.generate(["abc"], SamplingParams(max_tokens=8, temperature=0, decoding=decoding))[0]
        assert 1 <= len(out["token_ids"]) <= 8
        assert out["stats"]["tokens_per_forward"] > 0


def test_failed_convert_leaves_no_destination(tmp_path):
    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", tokenizer=True, vocab_size=260)
    for bad in (-5, 260):
        with pytest.raises(ConvertError, match=f"mask token id {bad} is outside the embedding"):
            convert(src, tmp_path / "dst", mask_token_id=bad)
        assert not (tmp_path / "dst").exists()
    bare = make_hf_checkpoint(tmp_path / "bare", family="qwen3", tokenizer=False, vocab_size=260)
    with pytest.raises(ConvertError, match="outside the embedding"):  # no tokenizer: the id is checked too
        convert(bare, tmp_path / "dst", mask_token_id=-1)
    with pytest.raises(ConvertError, match="no loadable tokenizer"):  # fails after the folder is made
        convert(bare, tmp_path / "deep" / "dst")
    assert not (tmp_path / "deep").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(ConvertError):
        convert(bare, kept)
    assert (kept / "notes.txt").read_text() == "mine"  # a folder that was there stays


def test_convert_refuses_a_destination_that_holds_files(tmp_path):
    """A checkpoint written among older files would not load (a stale shard index names shards it
    does not have), so the destination must be new or empty; nothing in it is touched."""
    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", tokenizer=True, vocab_size=260)
    stale = tmp_path / "old"
    stale.mkdir()
    (stale / "model.safetensors.index.json").write_text('{"weight_map": {"x": "model-00002.safetensors"}}')
    with pytest.raises(ConvertError, match="the destination exists and is not an empty folder"):
        convert(src, stale)
    assert [f.name for f in stale.iterdir()] == ["model.safetensors.index.json"]
    with pytest.raises(ConvertError, match="is not an empty folder"):
        convert(src, stale / "model.safetensors.index.json")
    (tmp_path / "empty").mkdir()
    assert (convert(src, tmp_path / "empty") / "config.json").is_file()


def test_a_source_config_that_is_not_json_is_named(tmp_path):
    src = make_hf_checkpoint(tmp_path / "src", family="qwen3", tokenizer=True, vocab_size=260)
    (src / "config.json").write_text("{model_type: qwen3")
    with pytest.raises(ConvertError, match=rf"{src / 'config.json'}: not a JSON file \(Expecting property name"):
        convert(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_convert_of_the_shipped_model_prints_only_its_result(tmp_path):
    """As a process, so the CLI's own logging setup is what prints (or not)."""
    repo = Path(__file__).resolve().parents[1]
    dst = tmp_path / "copy"
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "wedlm.cli.main", "convert", "models/wedlm-tiny", str(dst)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote WeDLM checkpoint to {dst}\n"
    assert proc.stderr == ""  # transformers' unknown-model_type warning is noise for a tokenizer load
    assert json.loads((dst / "config.json").read_text())["mask_token_id"] == 3
