"""RLCR rewards: accuracy of the answer turn, Brier reward of the confidence turn, and the single-turn
paper reward (format + accuracy + Brier, weighted)."""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

from math_verify import parse

from nemo_azr.rewards.accuracy import answer_matches, normalize_text
from nemo_azr.rlcr.parsing import extract_answer_tag, parse_confidence, single_turn_format_ok

ANSWER_MATCH_MODES = ("auto", "math", "qa")
QA_MATCH_MODES = ("exact", "f1")


def brier_reward(acc: float, confidence: float | None) -> float:
    """Seed 003's confidence reward ``1 - (acc - c)^2``; 0 for a format/parse failure.

    ``confidence`` is None (no tag, not a number) or outside ``[0, 1]`` / not finite -> 0.0.
    """
    if confidence is None:
        return 0.0
    c = float(confidence)
    if not (math.isfinite(c) and 0.0 <= c <= 1.0):
        return 0.0
    return 1.0 - (float(acc) - c) ** 2


def token_f1(gold: str, prediction: str) -> float:
    """SQuAD token F1 between the normalised gold and prediction (0.0 when either is empty)."""
    gold_tokens = normalize_text(gold).split()
    pred_tokens = normalize_text(prediction).split()
    if not gold_tokens or not pred_tokens:
        return 0.0
    common = sum((Counter(gold_tokens) & Counter(pred_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@functools.lru_cache(maxsize=65536)
def _gold_is_math(gold: str) -> bool:
    """Whether math-verify can parse the gold answer (golds repeat every step, hence the cache)."""
    try:
        return bool(parse(gold, parsing_timeout=None))
    except Exception:
        return False


def _qa_match(gold: str, answer: str, qa_match: str, f1_threshold: float) -> float:
    if qa_match == "f1":
        return 1.0 if token_f1(gold, answer) >= f1_threshold else 0.0
    normalized = normalize_text(answer)
    return 1.0 if normalized and normalized == normalize_text(gold) else 0.0


def answer_accuracy(
    gold: str,
    response: str,
    *,
    answer_match: str = "auto",
    qa_match: str = "exact",
    f1_threshold: float = 0.5,
) -> float:
    """Seed 003's ``acc_reward``: 1.0 if ``verify(gold, answer)`` else 0.0.

    The answer is the content of the last ``<answer>`` tag; a response without one scores 0
    (decision: the tag is part of the task); for a numeric gold the tag's last number is compared
    (``<answer>17 + 25</answer>`` is not 42). ``answer_match``: ``auto`` uses math-verify when the
    gold parses as math and the QA rule otherwise (short-answer QA such as HotpotQA); ``math``
    always uses math-verify (with its own exact-match fallback); ``qa`` always uses the QA rule:
    normalised exact match (``qa_match=exact``) or token F1 >= ``f1_threshold`` (``qa_match=f1``).
    """
    answer = extract_answer_tag(str(response))
    if not answer:
        return 0.0
    gold = str(gold)
    if answer_match == "math" or (answer_match == "auto" and _gold_is_math(gold)):
        return answer_matches(gold, answer)
    return _qa_match(gold, answer, qa_match, f1_threshold)


@dataclass(frozen=True)
class SingleTurnReward:
    """The parts of the single-turn RLCR reward and their weighted sum."""

    total: float
    format_ok: bool
    accuracy: float
    brier: float
    confidence: float | None


def single_turn_reward(
    gold: str,
    response: str,
    *,
    format_weight: float,
    accuracy_weight: float,
    brier_weight: float,
    answer_match: str = "auto",
    qa_match: str = "exact",
    f1_threshold: float = 0.5,
) -> SingleTurnReward:
    """The RLCR paper's one-turn reward: ``w_f * format + w_a * acc + w_b * brier_reward(acc, c)``."""
    acc = answer_accuracy(
        gold, response, answer_match=answer_match, qa_match=qa_match, f1_threshold=f1_threshold
    )
    confidence = parse_confidence(response)
    fmt = single_turn_format_ok(response)
    brier = brier_reward(acc, confidence)
    total = format_weight * float(fmt) + accuracy_weight * acc + brier_weight * brier
    return SingleTurnReward(total=total, format_ok=fmt, accuracy=acc, brier=brier, confidence=confidence)
