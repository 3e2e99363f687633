"""Where a response states its final answer, read so that a model cannot game the reward.

A real chat model writes prose around its answer ("To add 17 and 25 we ... so 17 + 25 = 42."), and
math-verify run over the whole text would accept any expression in it: echoing the question
("17 + 25 is a sum of two numbers.") parses as ``17 + 25`` and scores as correct. So the answer
is taken only from where the response states it, in this order:

1. the last complete ``<answer>...</answer>`` tag;
2. else the last ``\\boxed{...}`` (balanced braces);
3. else the last "the answer is X" / "Answer: X" phrase, up to the end of its sentence.

For a numeric gold answer the prediction is the **last number literal** of that span, or of the
whole response when it states none of the three (the usual "last number" rule of GSM8K-style
evaluation). Unevaluated expressions never count: ``17 + 25`` reads as ``25``.
Everything here is pure string handling and never raises.
"""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
BOXED_OPEN = "\\boxed{"
# "The final answer is 42." / "Answer: 42" / "answer = 42": the phrase's text up to the end of its
# sentence (a period followed by space or end, a newline, or ", " which starts a new clause).
_ANSWER_PHRASE = re.compile(r"\banswer\s*(?:is|:|=)\s*(.+?)(?=\.\s|\.$|\n|,\s|$)", re.IGNORECASE)
# A number literal: optional sign (a minus right after a digit, letter or bracket is a binary
# minus, not a sign), digits with optional thousands separators, decimals, or a fraction a/b.
_NUMBER = re.compile(
    r"(?<![\d.,/])(?:(?<![\w)\]}])[-−])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\d/])"
)
_NUMERIC_GOLD = re.compile(r"\s*[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?\s*")
MAX_NUMBER_CHARS = 64  # longer digit strings are not a short final answer (and int() would refuse)
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\{\s*([-−]?\d+)\s*\}\{\s*(\d+)\s*\}")


def answer_tag(text: str) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>``, or None."""
    matches = ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind(BOXED_OPEN)
    while start != -1:
        depth, i = 1, start + len(BOXED_OPEN)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(BOXED_OPEN) : i - 1].strip()
        start = text.rfind(BOXED_OPEN, 0, start)  # unbalanced (cut off): try an earlier one
    return None


def answer_phrase(text: str) -> str | None:
    """The text after the last "answer is" / "answer:" phrase, up to the end of its sentence."""
    matches = _ANSWER_PHRASE.findall(text)
    return matches[-1].strip() if matches else None


def final_answer_span(text: str) -> str | None:
    """Where the response states its final answer: tag, else boxed, else answer phrase; or None."""
    for extract in (answer_tag, last_boxed, answer_phrase):
        span = extract(text)
        if span is not None:
            return span
    return None


def last_number(text: str) -> str | None:
    """The last number literal in ``text`` (normalised: no thousands separators, ASCII minus)."""
    matches = _NUMBER.findall(_LATEX_FRACTION.sub(r"\1/\2", text))  # \frac{3}{4} is the number 3/4
    if not matches:
        return None
    return matches[-1].replace(",", "").replace("−", "-")


def is_numeric(gold: str) -> bool:
    """Whether a gold answer is a plain number (integer, decimal or fraction)."""
    return _NUMERIC_GOLD.fullmatch(gold) is not None


def as_fraction(literal: str) -> Fraction | None:
    """Exact value of a number literal ("42", "-3.5", "3/4", "1,234"), or None."""
    literal = literal.strip().replace(",", "").replace("−", "-")
    if not literal or len(literal) > MAX_NUMBER_CHARS:
        return None
    try:
        return Fraction(literal)
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_answer(text: str, *, numeric: bool) -> str | None:
    """The final answer of a response: for a numeric gold the last number of the stated span (or of
    the whole text when no span is stated), otherwise the stated span itself."""
    span = final_answer_span(text)
    if not numeric:
        return span
    return last_number(text if span is None else span)
