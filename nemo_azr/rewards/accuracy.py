"""Accuracy rewards: math equivalence (math-verify) and SQuAD-style normalized exact match.

Both take the gold answer and the model's response text and return 1.0 or 0.0. They never raise:
a reward that crashes on one garbage sample would stop a whole training step. The answer is read
only from where the response states it (:mod:`nemo_azr.rewards.answer_extraction`): never from
the whole text, so echoing the question or listing candidates does not score.

math-verify guards parsing and comparison with ``signal.alarm``, which only works in the main
thread. Off the main thread those alarms are disabled; the guards that always apply (a length cap,
and refusing expressions whose evaluation could take forever, like ``10**10**10``) stand in for them.
"""

from __future__ import annotations

import functools
import logging
import re
import string
import threading

import sympy
from math_verify import parse, verify

from nemo_azr.registry import REWARD_FUNCTIONS
from nemo_azr.rewards.answer_extraction import (
    NO_ANSWER,
    as_fraction,
    extract_final_answer,
    is_numeric,
    read_numeric_answer,
)

MAX_ANSWER_CHARS = 10_000  # longer answer text is never a short final answer; parsing it is slow
MAX_RESPONSE_CHARS = 200_000  # regex scans of longer responses are not worth it: scored 0
MAX_EXPONENT = 1_000  # |exponent| above this (or a power tower) could take forever to compare
MAX_COMBINATORIAL_ARG = 1_000  # factorial(10**6) etc.
MAX_EXPRESSION_NODES = 2_000
SIGNAL_TIMEOUT_S = 5  # math-verify's own alarm, used in the main thread only
VERIFY_CACHE_SIZE = 65_536  # (gold, answer) pairs; a few MB at most

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_COMBINATORIAL = (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.binomial, sympy.gamma)


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; we turn it off on purpose (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def extract_answer(response: str, gold: str | None = None, question: str = "") -> str | None:
    """The response's final answer as :func:`accuracy_reward` compares it with ``gold``: for a numeric
    gold the one number it states (strict: :func:`read_numeric_answer`), else the stated answer; or
    None."""
    if gold is not None and is_numeric(str(gold)):
        reading = read_numeric_answer(str(response), question)
        return _literal(reading.value) if reading.ok else None
    return extract_final_answer(str(response), numeric=False)


def _literal(value) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _is_tame(expr: object) -> bool:
    """False for sympy expressions whose comparison might not finish (huge powers, factorials)."""
    if not isinstance(expr, sympy.Basic):
        return True  # plain strings are compared as strings
    for count, node in enumerate(sympy.preorder_traversal(expr)):
        if count > MAX_EXPRESSION_NODES:
            return False
        if isinstance(node, sympy.Pow):
            exponent = node.exp
            if exponent.has(sympy.Pow) or (exponent.is_Number and abs(exponent) > MAX_EXPONENT):
                return False
        if isinstance(node, _COMBINATORIAL) and any(
            arg.is_Number and abs(arg) > MAX_COMBINATORIAL_ARG for arg in node.args
        ):
            return False
    return True


def _parse_math(text: str, timeout: int | None) -> list:
    """math-verify's parse; a bare LaTeX string ("\\frac{\\pi}{2}", or a span taken out of its
    ``\\boxed{}``) only parses inside math delimiters, so that is tried second for LaTeX-looking
    text (plain words in delimiters would parse as products of symbols)."""
    parsed = parse(text, parsing_timeout=timeout)
    if not parsed and "\\" in text:
        parsed = parse(f"${text}$", parsing_timeout=timeout)
    return parsed


@functools.lru_cache(maxsize=VERIFY_CACHE_SIZE)
def _math_verify(gold: str, answer: str) -> float | None:
    """1.0/0.0 from math-verify, or None when the gold answer is not parseable as math.

    Cached: RL samples many identical answers per prompt, and parsing dominates reward time.
    Exceptions (time-outs) propagate and are not cached.
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    timeout = SIGNAL_TIMEOUT_S if in_main_thread else None
    gold_parsed = _parse_math(gold, timeout)
    if not gold_parsed:
        return None
    answer_parsed = _parse_math(answer, timeout)
    if not answer_parsed or not all(_is_tame(x) for x in (*gold_parsed, *answer_parsed)):
        return 0.0
    return 1.0 if verify(gold_parsed, answer_parsed, timeout_seconds=timeout) else 0.0


def answer_matches(gold: str, answer: str) -> float:
    """1.0 if an extracted ``answer`` equals ``gold``, else 0.0 (never raises).

    A numeric gold is compared exactly with the one number the answer states ("42.0", "84/2",
    "forty-two" and "17 + 25 = 42" all equal 42; "17 + 25" and "41 or 42" state no one number:
    :func:`read_numeric_answer`). Other golds go to math-verify on the answer when the gold parses
    as math, else to :func:`normalized_exact_match`.
    """
    try:
        gold, answer = str(gold), str(answer).strip()
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        if is_numeric(gold):
            reading = read_numeric_answer(answer)
            return 1.0 if reading.ok and reading.value == as_fraction(gold) else 0.0
        result = _math_verify(gold, answer)
        return _exact_match(gold, answer) if result is None else result
    except BaseException as exc:  # math-verify's TimeoutException derives from BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return 0.0


@REWARD_FUNCTIONS.register("math_verify")
def accuracy_reward(gold: str, response: str, question: str = "") -> float:
    """1.0 if the response's final answer equals ``gold``, else 0.0. Never raises.

    The answer is the last ``<answer>`` tag, else the last ``\\boxed{}``, else the last "the answer is"
    phrase. For a numeric gold it must state exactly one number (:func:`read_numeric_answer`; an
    unmarked reply counts where it is a bare answer, ends by stating a result, or restates
    ``question``'s expression with one). For other golds a response that states no answer is only
    compared whole, by normalised exact match (a short-answer reply "Paris." for "Paris"), which an
    echo of the question cannot pass.
    """
    return accuracy_with_reason(gold, response, question)[0]


def accuracy_with_reason(gold: str, response: str, question: str = "") -> tuple[float, str]:
    """:func:`accuracy_reward` and, for a numeric gold whose reply states no one number, why
    (``answer_extraction.REJECTIONS``); the reason is "" otherwise."""
    try:
        response, gold = str(response), str(gold)
        if len(response) > MAX_RESPONSE_CHARS:
            return 0.0, NO_ANSWER
        if is_numeric(gold):
            reading = read_numeric_answer(response, question)
            if not reading.ok:
                return 0.0, reading.reason
            return (1.0 if reading.value == as_fraction(gold) else 0.0), ""
        answer = extract_final_answer(response, numeric=False)
        if answer is None:
            return _exact_match(gold, response), ""
        return answer_matches(gold, answer), ""
    except Exception:  # string handling only; a reward must never stop a step
        return 0.0, NO_ANSWER


def normalize_text(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


@REWARD_FUNCTIONS.register("exact_match")
def normalized_exact_match(gold: str, response: str) -> float:
    """1.0 if gold and the response's stated answer agree after :func:`normalize_text`, else 0.0.

    The stated answer is the tag / boxed / "answer is" span; a response without one is compared whole
    (short-answer QA replies are often just the answer)."""
    try:
        response = str(response)
        answer = extract_final_answer(response, numeric=False)
        return _exact_match(str(gold), response if answer is None else answer)
    except Exception:
        return 0.0


def _exact_match(gold: str, answer: str) -> float:
    normalized = normalize_text(answer)
    return 1.0 if normalized and normalized == normalize_text(gold) else 0.0
