"""Supervised warm-up targets for RLCR: templated turns that teach a tiny model the output format.

Answers are ``<think>..</think><answer>..</answer>`` and a share (``rlcr.warmup_wrong_frac``) is
deliberately wrong, so after the warm-up the policy's answers are sometimes wrong and the
confidence has something to be calibrated against. Confidence turns are
``<analysis>..</analysis><confidence>p</confidence>`` with ``p`` drawn uniformly from a grid,
independent of correctness (decision): the warm-up teaches the format and a spread of values, and
calibration is left to RL, so the two-turn / single-turn comparison measures RL.
"""

from __future__ import annotations

import random

from nemo_azr.contracts.task import Example
from nemo_azr.errors import ConfigError

CONFIDENCE_GRID = tuple(round(0.1 * k, 1) for k in range(1, 10))  # 0.1 .. 0.9
ANALYSIS_TEXTS = ("I check the sum.", "I am not sure.", "The steps look right.")
GENERIC_THINK = "Solve it."
MAX_WRONG_OFFSET = 3


def think_text(example: Example) -> str:
    """Short reasoning: the expression for arithmetic examples, a fixed phrase otherwise."""
    meta = example.meta
    if {"a", "op", "b"} <= set(meta):
        return f"{meta['a']} {meta['op']} {meta['b']}"
    return GENERIC_THINK


def wrong_answer(example: Example, rng: random.Random, pool: list[Example]) -> str:
    """A plausible wrong answer: the gold integer moved by a small non-zero offset, else another
    example's gold."""
    try:
        gold = int(example.answer.strip())
    except ValueError:
        others = [ex.answer for ex in pool if ex.answer != example.answer]
        return rng.choice(others) if others else f"not {example.answer}"
    offset = rng.choice([d for d in range(-MAX_WRONG_OFFSET, MAX_WRONG_OFFSET + 1) if d])
    return str(gold + offset)


def answer_target(example: Example, rng: random.Random, *, wrong_frac: float, pool: list[Example]) -> str:
    answer = wrong_answer(example, rng, pool) if rng.random() < wrong_frac else example.answer
    return f"<think>{think_text(example)}</think><answer>{answer}</answer>"


def confidence_target(rng: random.Random, prefill: str = "") -> str:
    """A templated confidence turn; with ``prefill`` (``rlcr.confidence_prefill``, already in the
    context) only the text after it: ``"<confidence>"`` -> ``"0.3</confidence>"``."""
    analysis, value = rng.choice(ANALYSIS_TEXTS), rng.choice(CONFIDENCE_GRID)
    full = f"<analysis>{analysis}</analysis><confidence>{value}</confidence>"
    for text in (full, f"<confidence>{value}</confidence>"):
        if text.startswith(prefill):
            return text[len(prefill) :]
    raise ConfigError(
        f"the RLCR warm-up has no confidence target that continues rlcr.confidence_prefill={prefill!r}: "
        "use a prefill the templated turn starts with ('<analysis>', '<confidence>', '<confidence>0.') "
        "or no warm-up"
    )
