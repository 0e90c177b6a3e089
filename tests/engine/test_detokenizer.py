"""Incremental detokenisation: UTF-8 safe increments, stop strings across tokens, holdback."""

from pathlib import Path

from wedlm.engine.detokenizer import IncrementalDetokenizer
from wedlm.testing import byte_tokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
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


def test_backend_decode_gives_the_wrapper_text():
    """The shipped tokenizer streams through the `tokenizers` backend's decode (`text_decoder`);
    every piece, stop strings and UTF-8 holdback included, is what `tokenizer.decode` gives."""
    import random

    from wedlm.engine.detokenizer import text_decoder
    from wedlm.tokenizer import load_tokenizer

    tok = load_tokenizer(SHIPPED)
    assert text_decoder(tok) is not tok.decode  # the fast path is taken

    class Wrapper:  # the same tokenizer seen only through its public decode
        decode = staticmethod(tok.decode)

    rng = random.Random(0)
    texts = ["12 + 35 = 47", "count: 1, 2, 3, 4", "sort [9, 3, 5] -> [3, 5, 9]"]
    sequences = [tok.encode(t, add_special_tokens=False) for t in texts]
    sequences += [[rng.randrange(len(tok)) for _ in range(40)] for _ in range(20)]
    for ids in sequences:
        for stops in ([], [", 3", "zz"]):
            assert feed(IncrementalDetokenizer(tok, stops), ids) == feed(IncrementalDetokenizer(Wrapper(), stops), ids)


def test_extend_gives_the_text_of_adding_one_token_at_a_time():
    """`extend` (a commit's tokens at once, no stop strings) leaves the text `add` leaves after
    every group, multi-byte characters split across groups included, and the same final text;
    with stop strings it refuses."""
    import random

    import pytest

    from wedlm.tokenizer import load_tokenizer

    rng = random.Random(1)
    shipped = load_tokenizer(SHIPPED)
    cases = [(TOK, TOK.encode(TEXT * 3)), (TOK, [rng.randrange(256) for _ in range(200)])]
    cases += [(shipped, [rng.randrange(len(shipped)) for _ in range(120)]) for _ in range(5)]
    cases += [(shipped, shipped.encode("count: 1, 2, 3 ... 47 + 8 = 55", add_special_tokens=False))]
    for tok, ids in cases:
        for _ in range(5):
            one, many = IncrementalDetokenizer(tok), IncrementalDetokenizer(tok)
            i = 0
            while i < len(ids):
                group = ids[i:i + rng.randrange(1, 9)]
                i += len(group)
                for t in group:
                    one.add(t)
                many.extend(group)
                assert many.text == one.text and many.flush() == one.flush()
            assert many.finish() == one.finish()
    with pytest.raises(ValueError, match="stop strings"):
        IncrementalDetokenizer(TOK, ["x"]).extend([1, 2])
