"""Answer extraction: the final number of a reasoning chain, GSM8K's `#### N`, MATH's `\\boxed{}`.

What: pure string functions that pull the answer a model committed to out of its
generated text, and normalisers that decide whether two answers are equal.

Why: accuracy is only as good as its extraction. The rules follow the usual
GSM8K / MATH harnesses: an explicit marker wins (`#### N`, `Final answer: N`,
`The answer is N`, `\\boxed{...}`), otherwise the last number in the text is taken;
numbers are compared after removing thousands separators, `$`, `%` and trailing
zeros, so "1,000", "1000.00" and "$1000" all equal "1000".
"""

from __future__ import annotations

import re
from fractions import Fraction

# A minus sign counts only when it does not follow a word or ")" ("10-5" ends on 5, not -5);
# commas only as thousands separators ("1, 2, 3" is three numbers, "1,000" one).
_NUMBER = r"(?:(?<![\w)])-)?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
NUMBER_RE = re.compile(_NUMBER)
_MARKERS = (
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"final answer\s*(?:is|:|=)?\s*:?\s*(" + _NUMBER + ")", re.IGNORECASE),
    re.compile(r"the answer is\s*:?\s*(" + _NUMBER + ")", re.IGNORECASE),
)


def normalize_number(text: str | None) -> str | None:
    """Canonical form of a number string, or None when `text` holds no number.

    "1,234" -> "1234", "$5" -> "5", "3.50" -> "3.5", "7.0" -> "7", "-0" -> "0",
    "12%" -> "12", " 42. " -> "42", "1/2" -> "0.5".
    """
    if text is None:
        return None
    s = text.strip().rstrip(".").replace(",", "").replace("$", "").replace("%", "").replace(" ", "")
    if not s:
        return None
    try:
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    if value.denominator == 1:
        return str(value.numerator)
    return repr(float(value))


def extract_gsm8k_reference(answer: str) -> str | None:
    """The gold number of a GSM8K `answer` field (the text after the last `####`)."""
    if "####" not in answer:
        return None
    tail = answer.rsplit("####", 1)[1].split()
    return normalize_number(tail[0]) if tail else None


def extract_final_number(text: str) -> str | None:
    """The number a generation ends on, normalised (see `normalize_number`).

    Order: the LAST `#### N`, then the last `Final answer: N`, then the last
    `The answer is N`, then the last `\\boxed{N}` holding a number, then the last
    number anywhere in the text. Returns None when the text has no number.
    """
    for marker in _MARKERS:
        hits = marker.findall(text)
        if hits:
            return normalize_number(hits[-1])
    boxed = extract_boxed(text)
    if boxed is not None and normalize_number(boxed) is not None:
        return normalize_number(boxed)
    numbers = NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent.

    `\\boxed 5` (no braces) yields "5". An unclosed brace yields None.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.index("box", start) + 3  # just after "\boxed"/"\fbox" minus the "ed"
    if text.startswith("ed", i):
        i += 2
    if i < len(text) and text[i] == " ":
        rest = text[i + 1:].split("$")[0].split()
        return rest[0] if rest else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


_LATEX_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", " ")
_UNITS = re.compile(r"\\text\{\s*[a-zA-Z ]*\}|\\mbox\{[^}]*\}")


def normalize_math_answer(answer: str | None) -> str | None:
    """Light canonical form of a MATH answer for string comparison.

    Drops `\\left`/`\\right`, spacing commands, `$`, `^\\circ`, a trailing period,
    `\\text{...}` units; maps `\\dfrac`/`\\tfrac` to `\\frac`; writes `\\frac12` as
    `\\frac{1}{2}`; "0.5" style numbers go through `normalize_number`.
    """
    if answer is None:
        return None
    s = answer.strip()
    s = _UNITS.sub("", s)
    for token in _LATEX_DROP:
        s = s.replace(token, "")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\{(\d+)\}(\d)", r"\\frac{\1}{\2}", s)
    s = s.rstrip(".")
    number = normalize_number(s) if NUMBER_RE.fullmatch(s) else None
    if number is not None:
        return number
    frac = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", s)
    if frac and int(frac.group(3)) != 0:
        return normalize_number(f"{frac.group(1)}{Fraction(int(frac.group(2)), int(frac.group(3)))}")
    return s


def math_answers_equal(predicted: str | None, reference: str | None) -> bool:
    """True when two MATH answers agree after `normalize_math_answer` (None never matches)."""
    a, b = normalize_math_answer(predicted), normalize_math_answer(reference)
    return a is not None and b is not None and a == b


def numbers_equal(predicted: str | None, reference: str | None) -> bool:
    """True when both strings normalise to the same number (None never matches)."""
    a, b = normalize_number(predicted), normalize_number(reference)
    return a is not None and a == b
