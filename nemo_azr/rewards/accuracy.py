"""Accuracy rewards: math equivalence (math-verify) and SQuAD-style normalized exact match.

Both take the gold answer and the model's response text and return 1.0 or 0.0. They never raise:
a reward that crashes on one garbage sample would stop a whole training step.

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

MAX_ANSWER_CHARS = 10_000  # longer answer text is never a short final answer; parsing it is slow
MAX_EXPONENT = 1_000  # |exponent| above this (or a power tower) could take forever to compare
MAX_COMBINATORIAL_ARG = 1_000  # factorial(10**6) etc.
MAX_EXPRESSION_NODES = 2_000
SIGNAL_TIMEOUT_S = 5  # math-verify's own alarm, used in the main thread only
VERIFY_CACHE_SIZE = 65_536  # (gold, answer) pairs; a few MB at most

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_COMBINATORIAL = (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.binomial, sympy.gamma)


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; we turn it off on purpose (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def extract_answer(response: str) -> str:
    """The content of the last complete ``<answer>...</answer>`` tag, else the whole response."""
    matches = _ANSWER_TAG.findall(response)
    return matches[-1].strip() if matches else response.strip()


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


@functools.lru_cache(maxsize=VERIFY_CACHE_SIZE)
def _math_verify(gold: str, answer: str) -> float | None:
    """1.0/0.0 from math-verify, or None when the gold answer is not parseable as math.

    Cached: RL samples many identical answers per prompt, and parsing dominates reward time.
    Exceptions (time-outs) propagate and are not cached.
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    timeout = SIGNAL_TIMEOUT_S if in_main_thread else None
    gold_parsed = parse(gold, parsing_timeout=timeout)
    if not gold_parsed:
        return None
    answer_parsed = parse(answer, parsing_timeout=timeout)
    if not answer_parsed or not all(_is_tame(x) for x in (*gold_parsed, *answer_parsed)):
        return 0.0
    return 1.0 if verify(gold_parsed, answer_parsed, timeout_seconds=timeout) else 0.0


@REWARD_FUNCTIONS.register("math_verify")
def accuracy_reward(gold: str, response: str) -> float:
    """1.0 if the response's answer is mathematically equal to ``gold`` (math-verify), else 0.0.

    An ``<answer>...</answer>`` wrapper is stripped first. A gold answer that is not math at all
    (e.g. a word) falls back to :func:`normalized_exact_match`. Never raises.
    """
    try:
        answer = extract_answer(str(response))
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        result = _math_verify(str(gold), answer)
        return normalized_exact_match(gold, answer) if result is None else result
    except BaseException as exc:  # math-verify's TimeoutException derives from BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return 0.0


def normalize_text(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


@REWARD_FUNCTIONS.register("exact_match")
def normalized_exact_match(gold: str, response: str) -> float:
    """1.0 if gold and the response's answer agree after :func:`normalize_text`, else 0.0."""
    try:
        answer = extract_answer(str(response))
        normalized = normalize_text(answer)
        return 1.0 if normalized and normalized == normalize_text(str(gold)) else 0.0
    except Exception:
        return 0.0
