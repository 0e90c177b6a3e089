"""Chat SFT documents: prompt unmasked, reply + <|im_end|> maskable, learnable end tokens after the last reply."""

import pytest

from wedlm.testing import byte_tokenizer
from wedlm.train.config import TrainConfig
from wedlm.train.data import chat_document


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(260)


def _end(tok):
    return tok.get_vocab()["<|im_end|>"]


def test_learnable_ends_follow_the_last_reply_only(tok):
    messages = [{"role": "user", "content": "a?"}, {"role": "assistant", "content": "bc"},
                {"role": "user", "content": "d?"}, {"role": "assistant", "content": "ef"}]
    end = _end(tok)
    plain = chat_document(messages, tok, end)
    padded = chat_document(messages, tok, end, learnable_ends=8)
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    # without extra ends the conversation ends with <|im_end|> + the template's newline (unmasked)
    assert plain.ids[-1 - len(newline):] == [end] + newline and plain.maskable[-1] is False
    # with them: everything up to the last reply's <|im_end|> is identical, then 8 more, all scored
    cut = len(plain.ids) - len(newline)
    assert padded.ids[:cut] == plain.ids[:cut] and padded.maskable[:cut] == plain.maskable[:cut]
    assert padded.ids[cut:] == [end] * 8 and all(padded.maskable[cut:])
    # the first reply keeps exactly one <|im_end|> followed by the newline
    first_end = plain.ids.index(end, plain.ids.index(end) + 1)  # [0] ends the first user turn
    assert padded.ids[first_end + 1: first_end + 1 + len(newline)] == newline
    # the number of scored tokens: replies ("bc", "ef") + their <|im_end|> + 8 learnable ends
    assert sum(padded.maskable) == sum(plain.maskable) + 8
    with pytest.raises(ValueError, match="learnable_ends"):
        chat_document(messages, tok, end, learnable_ends=-1)


def test_config_validates_new_knobs(tmp_path):
    base = dict(stage="wedlm", data="x", tokenizer="t", out_dir=str(tmp_path), init="m")
    assert TrainConfig(**base).num_learnable_im_end == 8 and TrainConfig(**base).loss_mix == "sum"
    with pytest.raises(ValueError, match="loss_mix"):
        TrainConfig(**base, loss_mix="avg")
    with pytest.raises(ValueError, match="num_learnable_im_end"):
        TrainConfig(**base, num_learnable_im_end=-2)


def test_precision_auto_follows_the_cpu():
    from wedlm.hardware import cpu_flags, training_precision

    amx = cpu_flags("processor: 0\nflags\t\t: fpu sse avx2 amx_bf16 amx_tile\n")
    assert "amx_bf16" in amx
    assert training_precision("auto", cuda=False, flags=amx) == "bf16"
    assert training_precision("auto", cuda=False, flags={"avx2", "fma"}) == "no"
    assert training_precision("auto", cuda=False, flags={"avx512_bf16"}) == "bf16"
    assert training_precision("auto", cuda=True, flags=set()) == "bf16"
    assert training_precision("no", cuda=True, flags=amx) == "no"
    with pytest.raises(ValueError, match="mixed_precision"):
        training_precision("fp16", cuda=False)


def test_data_skip_reads_only_unseen_records(tmp_path, tok):
    import json

    from wedlm.train.data import load_documents, read_jsonl

    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
             "source": "even" if i % 2 == 0 else "odd"} for i in range(10)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" + ("\n" if i == 3 else "") for i, r in enumerate(rows)))
    # blank lines are not records: skip 4 lands on record 4, limit 3 ends at record 6
    got = read_jsonl(path, limit=3, skip=4)
    assert [r["messages"][0]["content"] for r in got] == ["q4", "q5", "q6"]
    assert read_jsonl(path, skip=10) == []
    # a continued stage: skip, then cap one source; the first kept document is record 5 ("odd")
    docs = load_documents(path, tok, "chat", limit=4, source_limits={"even": 1}, skip=4)
    assert len(docs) == 3  # q4 (even), q5, q7 (odd); q6 is the second "even" and is dropped
    expected = tok("a7", add_special_tokens=False)["input_ids"]
    text_ids = docs[-1].ids
    assert any(text_ids[i:i + len(expected)] == expected for i in range(len(text_ids)))
    with pytest.raises(ValueError, match="data_skip"):
        TrainConfig(stage="wedlm", data="x", tokenizer="t", out_dir="o", init="m", data_skip=-1)


def test_wedlm_cpu_bf16_overrides_the_detection_only_without_explicit_flags(monkeypatch):
    from wedlm.hardware import cpu_has_bf16_units, training_precision

    monkeypatch.setenv("WEDLM_CPU_BF16", "1")
    assert cpu_has_bf16_units() and training_precision("auto", cuda=False) == "bf16"
    assert not cpu_has_bf16_units({"avx2"})  # explicit flags win
    monkeypatch.setenv("WEDLM_CPU_BF16", "0")
    assert not cpu_has_bf16_units() and training_precision("auto", cuda=False) == "no"
    assert cpu_has_bf16_units({"avx512_bf16"})
    monkeypatch.setenv("WEDLM_CPU_BF16", "yes")
    with pytest.raises(ValueError, match="WEDLM_CPU_BF16 must be '0' or '1', got 'yes'"):
        cpu_has_bf16_units()
