"""Where a response states its final answer, read so that a model cannot game the reward.

A real chat model writes prose around its answer ("To add 17 and 25 we ... so 17 + 25 = 42."), and
math-verify run over the whole text would accept any expression in it: echoing the question
("17 + 25 is a sum of two numbers.") parses as ``17 + 25`` and scores as correct. So the answer
is taken only from where the response states it, in this order:

1. the last complete ``<answer>...</answer>`` tag;
2. else the last ``\\boxed{...}`` (balanced braces);
3. else the last "the answer is X" / "Answer: X" phrase, up to the end of its sentence.

For a numeric gold answer the reading is strict (:func:`read_numeric_answer`): the stated answer
must be exactly one candidate - one number, or one number in words - after the last ``=`` of the
span (so ``17 + 25 = 42`` reads as 42 and ``17 + 25`` as two candidates). Two or more distinct
candidates ("41 or 42", ``<answer>10 42</answer>``, "44 43 42") score nothing, so a policy cannot
hedge. A reply that marks no span is read only where it is a bare answer ("42."), where its last
sentence states a result ("So the sum is 42.", "17 + 25 = 42."), or where it restates the question's
own expression with a result ("48 + 87 is 135, an increase of 18." for "What is 48 + 87?"). An echo
of the question is never an answer: it holds the question's numbers, not one result.
Everything here is pure string handling and never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from text_to_num import alpha2digit

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


# --- the strict numeric reading --------------------------------------------------------------------
#: Why a reply earned no numeric answer (counted per step as ``reward/answer_<reason>``).
NO_ANSWER = "no_answer"  # nothing that reads as a stated answer (or the stated one holds no number)
SEVERAL_CANDIDATES = "several_candidates"  # two or more distinct numbers where one answer belongs
UNMARKED = "unmarked"  # prose with numbers but no marked answer, bare answer or final result
REJECTIONS = (NO_ANSWER, SEVERAL_CANDIDATES, UNMARKED)
PROSE_THRESHOLD = 3  # in running prose "one" / "two" are often not numbers ("no one", "one of them")

# "... is 42", "... = 42", "... equals 42", "it's 42", "makes 42": a sentence stating its result
_RESULT_VERB = re.compile(
    r"(?:=|\bis\b|'s\b|\bequals\b|\bequal to\b|\bmakes\b|\bgives\b|\bresults in\b)", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# An arithmetic expression of a question: two operands and an operator ("48 + 87", "93 - 13").
_EXPRESSION = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([-+*/x×÷−])\s*(\d+(?:\.\d+)?)(?![\d.])")
# Filler a bare answer may carry ("42.", "42!", "**42**", "$42$").
_BARE_FILLER = re.compile(r"[\s.!*$`'\"]+")
# What may stand between the numbers of a list or a hedge ("41 or 42", "41, 42", "84 - 42").
_CONNECTIVES = re.compile(r"(?:or|maybe|perhaps|possibly|[,;/?+\-−*x×÷])", re.IGNORECASE)

# "minus 80" / "negative 80" (once number words are digits) is the number -80
_SIGN_WORD = re.compile(r"\b(?:minus|negative)\s+(?=\d)", re.IGNORECASE)


@dataclass(frozen=True)
class NumericReading:
    """A reply's numeric answer (``value``) or why it has none (``reason``, one of REJECTIONS)."""

    value: Fraction | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.value is not None


def digits(text: str, *, threshold: int = 0) -> str:
    """``text`` with numbers in words as digits ("one hundred thirty-five" -> "135", "minus eighty" ->
    "-80"; text2num's parser). ``threshold``: isolated words for numbers below it stay words (3
    keeps "no one knows" as it is, for prose); 0 converts every number word (an answer)."""
    try:
        converted = alpha2digit(text, "en", threshold=threshold)
    except Exception:  # a reward never raises: the text is read as written
        converted = text
    return _SIGN_WORD.sub("-", converted)


def candidates(text: str, *, threshold: int = 0) -> list[Fraction]:
    """The distinct values of the numbers in ``text`` (literals and numbers in words), in order."""
    values: list[Fraction] = []
    for literal in _NUMBER.findall(_LATEX_FRACTION.sub(r"\1/\2", digits(text, threshold=threshold))):
        value = as_fraction(literal)
        if value is not None and value not in values:
            values.append(value)
    return values


def _one_candidate(span: str) -> NumericReading:
    """The one result a stated span holds: what follows its last ``=`` (a restated equation),
    which must be exactly one distinct number."""
    result = span.rsplit("=", 1)[-1]
    values = candidates(result)
    if not values:
        return NumericReading(None, NO_ANSWER)
    if len(values) > 1:
        return NumericReading(None, SEVERAL_CANDIDATES)
    return NumericReading(values[0])


def _bare(text: str) -> NumericReading | None:
    """A reply that is nothing but one answer ("42", "-7.", "**42**", "forty-two"); a reply that is
    nothing but numbers and connectives ("41 or 42", "44 43 42", "84 - 42") is several candidates."""
    values = candidates(text)
    rest = _BARE_FILLER.sub("", _NUMBER.sub("", _LATEX_FRACTION.sub("", digits(text))))
    if len(values) == 1 and not rest:
        return NumericReading(values[0])
    if len(values) > 1 and not _CONNECTIVES.sub("", rest):
        return NumericReading(None, SEVERAL_CANDIDATES)
    return None


def _stated_result(sentence: str) -> NumericReading | None:
    """A sentence that states its result: the part after its last result verb ("So the sum is 42.")."""
    verbs = list(_RESULT_VERB.finditer(sentence))
    if not verbs:
        return None
    reading = _one_candidate(sentence[verbs[-1].end() :])
    return reading if reading.ok or reading.reason == SEVERAL_CANDIDATES else None


def _restated_question(text: str, question: str) -> NumericReading | None:
    """Results the reply gives for the question's own expression ("48 + 87 is 135"), one distinct."""
    values: list[Fraction] = []
    for m in _EXPRESSION.finditer(question):
        a, op, b = m.groups()
        pattern = rf"(?<![\d.]){re.escape(a)}\s*{re.escape(op)}\s*{re.escape(b)}\s*{_RESULT_VERB.pattern}\s*"
        for hit in re.finditer(pattern, text, re.IGNORECASE):
            after = _NUMBER.match(text, hit.end())
            value = as_fraction(after.group(0)) if after else None
            if value is not None and value not in values:
                values.append(value)
    if not values:
        return None
    return NumericReading(values[0]) if len(values) == 1 else NumericReading(None, SEVERAL_CANDIDATES)


def read_numeric_answer(text: str, question: str = "") -> NumericReading:
    """The one numeric answer a reply states, strictly (the module docstring has the rules)."""
    text = str(text)
    span = final_answer_span(text)
    if span is not None:
        return _one_candidate(span)
    stripped = text.strip()
    if not stripped:
        return NumericReading(None, NO_ANSWER)
    bare = _bare(stripped)
    if bare is not None:
        return bare
    if question:
        restated = _restated_question(stripped, question)
        if restated is not None:
            return restated
    sentences = [s for s in _SENTENCE_END.split(stripped) if s.strip()]
    stated = _stated_result(sentences[-1]) if sentences else None
    if stated is not None:
        return stated
    return NumericReading(None, UNMARKED if candidates(stripped, threshold=PROSE_THRESHOLD) else NO_ANSWER)
