"""Incremental detokenisation: UTF-8 safe increments, stop strings across tokens, holdback."""

from wedlm.engine.detokenizer import IncrementalDetokenizer
from wedlm.testing import byte_tokenizer

TOK = byte_tokenizer(260)
TEXT = "héllo wörld € ok"


def feed(detok, ids):
    pieces = []
    for t in ids:
        stopped = detok.add(t)
        pieces.append(detok.flush())
        if stopped:
            break
    pieces.append(detok.finish())
    return pieces


def test_multibyte_characters_are_never_split():
    ids = TOK.encode(TEXT)
    assert len(ids) > len(TEXT)  # é, ö and € take several byte tokens
    pieces = feed(IncrementalDetokenizer(TOK), ids)
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_across_tokens_is_cut_and_never_emitted():
    ids = TOK.encode(TEXT)
    detok = IncrementalDetokenizer(TOK, ["wör", "zzz"])
    pieces = feed(detok, ids)
    assert "".join(pieces) == "héllo "
    assert detok.stopped
    assert all("w" not in p for p in pieces)  # even the first byte of the stop string was held back


def test_held_back_prefix_is_released_when_it_does_not_match():
    ids = TOK.encode("ab ac")
    detok = IncrementalDetokenizer(TOK, ["ad"])
    pieces = feed(detok, ids)
    assert pieces == ["", "ab", " ", "", "ac", ""]
    assert not detok.stopped
