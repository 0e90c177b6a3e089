"""Answer extraction on hand-written cases (wedlm.evaluate.extract)."""

import pytest

from wedlm.evaluate.extract import (
    extract_boxed,
    extract_final_number,
    extract_gsm8k_reference,
    math_answers_equal,
    normalize_math_answer,
    normalize_number,
    numbers_equal,
)


@pytest.mark.parametrize("text, want", [
    ("1,234", "1234"), ("$5", "5"), ("3.50", "3.5"), ("7.0", "7"), ("-0", "0"), ("12%", "12"),
    (" 42. ", "42"), ("1/2", "0.5"), ("-3", "-3"), ("abc", None), ("", None), (None, None),
])
def test_normalize_number(text, want):
    assert normalize_number(text) == want


@pytest.mark.parametrize("text, want", [
    # explicit markers win over later numbers
    ("She has 5 + 3 = 8 apples.\n#### 8", "8"),
    ("#### 1,000\nSome trailing note 7", "1000"),
    ("2 x 7 = 14\n13 + 14 = 27\nFinal answer: 27", "27"),
    ("Final answer: 27. Check: 27 - 14 = 13", "27"),
    ("so the final answer is -4 apples", "-4"),
    ("The answer is $18.00 in total, not 20.", "18"),
    ("We get \\boxed{42} after 3 steps", "42"),
    # fallbacks: the last number, thousands separators, subtraction is not a sign
    ("first 3 then 10-5", "5"),
    ("values 1, 2, 3", "3"),
    ("total: 12,345 items", "12345"),
    ("x = -7", "-7"),
    ("no digits here", None),
    # several markers: the last one of the strongest kind
    ("#### 3\n#### 4", "4"),
])
def test_extract_final_number(text, want):
    assert extract_final_number(text) == want


def test_gsm8k_reference():
    answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72.\n#### 72"
    assert extract_gsm8k_reference(answer) == "72"
    assert extract_gsm8k_reference("#### 1,200") == "1200"
    assert extract_gsm8k_reference("no marker 5") is None
    assert extract_gsm8k_reference("####   ") is None


@pytest.mark.parametrize("text, want", [
    ("so $x = \\boxed{5}$.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("first \\boxed{1} then \\boxed{2}", "2"),
    ("nested \\boxed{\\sqrt{x^{2}}} end", "\\sqrt{x^{2}}"),
    ("\\fbox{7}", "7"),
    ("\\boxed 9$", "9"),
    ("unclosed \\boxed{3", None),
    ("nothing boxed", None),
])
def test_extract_boxed(text, want):
    assert extract_boxed(text) == want


@pytest.mark.parametrize("a, b, equal", [
    ("\\dfrac{1}{2}", "\\frac12", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("90^\\circ", "90", True),
    ("5\\text{ cm}", "5", True),
    ("\\sqrt{2}", "\\sqrt{3}", False),
    ("3", None, False),
])
def test_math_answers_equal(a, b, equal):
    assert math_answers_equal(a, b) is equal


def test_normalize_math_answer_keeps_expressions():
    assert normalize_math_answer("x^2 + 1") == "x^2+1"
    assert normalize_math_answer("-\\frac{3}{4}") == "-0.75"


def test_numbers_equal():
    assert numbers_equal("1,000", "1000.0")
    assert not numbers_equal("10", "100")
    assert not numbers_equal(None, "3")
