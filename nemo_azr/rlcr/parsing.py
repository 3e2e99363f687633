"""RLCR output format: the tags of seed 003 and how their contents are read.

Turn 1 (answer): ``<think>...</think><answer>...</answer>``.
Turn 2 (confidence): optional ``<analysis>...</analysis>`` then ``<confidence>p</confidence>``.
Single-turn (the RLCR paper's form): all four in one response.

Parsing never raises: garbage text is a format failure (``None`` / ``False``), not an exception.
"""

from __future__ import annotations

import math
import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
ANALYSIS_OPEN, ANALYSIS_CLOSE = "<analysis>", "</analysis>"
CONFIDENCE_OPEN, CONFIDENCE_CLOSE = "<confidence>", "</confidence>"

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CONFIDENCE_TAG = re.compile(r"<confidence>(.*?)</confidence>", re.DOTALL)
# A plain decimal: "0.7", ".7", "1", "1.0". No percent, exponent, nan or inf (decision: strict).
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_ANSWER_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_SINGLE_TURN_FORMAT = re.compile(
    r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*<analysis>.*?</analysis>\s*"
    r"<confidence>.*?</confidence>\s*$",
    re.DOTALL,
)


def extract_answer_tag(text: str) -> str | None:
    """Content of the last complete ``<answer>...</answer>`` (stripped), or None when there is none."""
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def parse_confidence(text: str) -> float | None:
    """The confidence in the last complete ``<confidence>...</confidence>`` tag, or None.

    None (a parse failure, rewarded 0) when: no complete tag; its content is not a plain decimal
    number (``"high"``, ``"90%"``, ``"nan"``, ``"1e-1"``); or the number is outside ``[0, 1]``.
    """
    matches = _CONFIDENCE_TAG.findall(str(text))
    if not matches:
        return None
    body = matches[-1].strip()
    if not _DECIMAL.fullmatch(body):
        return None
    value = float(body)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return None
    return value + 0.0  # "-0" -> 0.0


def answer_format_ok(text: str) -> bool:
    """Turn 1 is well formed: a ``<think>`` block followed by an ``<answer>`` block."""
    return _ANSWER_FORMAT.search(text) is not None


def confidence_format_ok(text: str) -> bool:
    """Turn 2 is well formed: a parseable ``<confidence>`` in ``[0, 1]`` (``<analysis>`` optional)."""
    return parse_confidence(text) is not None


def single_turn_format_ok(text: str) -> bool:
    """The single-turn response is exactly think, answer, analysis, confidence (in this order, nothing
    else around them) and the confidence parses."""
    return _SINGLE_TURN_FORMAT.match(text) is not None and parse_confidence(text) is not None
