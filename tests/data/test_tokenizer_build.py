"""Tests for the tokenizer builder and the ``python -m wedlm.data.build --quick`` pipeline.

A small tokenizer (1024 tokens, ~300 KB of text) is trained once per module;
it has the same pre-tokenizer, special tokens and template as the shipped
4096-token one, which is checked too when it is present in models/wedlm-tiny.
"""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from wedlm.data import build as build_mod
from wedlm.data.tokenizer_build import CHAT_TEMPLATE, build_tokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
MSGS = [{"role": "user", "content": "Count from 1 to 3."}, {"role": "assistant", "content": "1, 2, 3"}]
EXPECTED_CHAT = ("<|im_start|>user\nCount from 1 to 3.<|im_end|>\n"
                 "<|im_start|>assistant\n1, 2, 3<|im_end|>\n")
ROUND_TRIP = [
    "def f(x):\n    return {'a': x ** 2}  # comment\n\n\tpass\r\n",
    "héllo wörld, 日本語 🚀 — naïve café\n",
    "Count from 17 to 20.\n17, 18, 19, 20",
    "  leading and trailing spaces  ",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out, vocab_size=1024, synthetic_chars=100_000, code_chars=200_000)
    return out


@pytest.fixture(scope="module", params=["small", "shipped"])
def tok(request, tok_dir):
    if request.param == "shipped":
        if not (SHIPPED / "tokenizer.json").exists():
            pytest.skip("shipped tokenizer not built yet")
        return AutoTokenizer.from_pretrained(SHIPPED)
    return AutoTokenizer.from_pretrained(tok_dir)


def test_files_written(tok_dir):
    assert sorted(p.name for p in tok_dir.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((tok_dir / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_special_token_ids(tok):
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"])
    assert ids == [0, 1, 2, 3]
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (0, 0, 3)
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    assert tok.encode("a<|mask|>b")[1] == 3


def test_digits_one_per_token(tok):
    assert tok.tokenize("12345") == ["1", "2", "3", "4", "5"]
    assert len(tok.encode("12345")) == 5
    digit_ids = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    assert len(set(digit_ids)) == 10
    ids = tok.encode("x = 2024 + 317")
    assert sum(i in digit_ids for i in ids) == 7
    assert not any(t.strip("Ġ").isdigit() and len(t.strip("Ġ")) > 1 for t in tok.get_vocab())


def test_chat_template_exact(tok):
    assert tok.apply_chat_template(MSGS, tokenize=False) == EXPECTED_CHAT
    with_prompt = tok.apply_chat_template(MSGS[:1], tokenize=False, add_generation_prompt=True)
    assert with_prompt == "<|im_start|>user\nCount from 1 to 3.<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_vocab_size(tok, tok_dir):
    assert len(tok) == (1024 if tok.name_or_path == str(tok_dir) else 4096)


def test_build_quick_end_to_end(tmp_path):
    data, tok_out = tmp_path / "data", tmp_path / "tok"
    build_mod.main(["--out", str(data), "--tokenizer-out", str(tok_out), "--quick"])
    pretrain = [json.loads(line) for line in (data / "pretrain.jsonl").open()]
    sft = [json.loads(line) for line in (data / "sft.jsonl").open()]
    assert len(pretrain) > 100 and all(isinstance(d["text"], str) and d["text"] for d in pretrain)
    assert {d["source"] for d in pretrain} == {"counting", "sequence", "arithmetic", "equation", "code"}
    assert {r["source"] for r in sft} == {"counting", "sequence", "arithmetic", "equation", "code"}
    for r in sft:
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"]
        assert all(m["content"] for m in r["messages"])
    for task in ("counting", "arithmetic", "equation"):
        rows = [json.loads(line) for line in (data / "eval" / f"{task}.jsonl").open()]
        assert len(rows) == 20 and all(r["task"] == task for r in rows)
    train_prompts = {r["messages"][0]["content"] for r in sft} | {d["text"].split("\n")[0] for d in pretrain}
    assert not {r["prompt"] for r in rows} & train_prompts  # rows: the last eval task read above
    code = [json.loads(line) for line in (data / "eval" / "code_heldout.jsonl").open()]
    assert code and all(set(c) == {"path", "index", "text"} for c in code)
    stats = json.loads((data / "stats.json").read_text())
    assert stats["files"]["pretrain.jsonl"]["records"] == len(pretrain)
    assert not list(data.rglob(".*.tmp"))
    assert (tok_out / "tokenizer.json").exists() and not (tok_out / "config.json").exists()
    assert AutoTokenizer.from_pretrained(tok_out).mask_token_id == 3


def test_quick_refuses_shipped_tokenizer_dir():
    with pytest.raises(ValueError):
        build_mod.BuildConfig(quick=True)
