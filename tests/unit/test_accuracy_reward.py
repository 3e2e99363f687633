"""The math-verify accuracy reward and normalized exact match."""

from __future__ import annotations

import threading
import time

import pytest

from nemo_azr.registry import REWARD_FUNCTIONS
from nemo_azr.rewards.accuracy import accuracy_reward, extract_answer, normalized_exact_match

CASES = [
    ("8", "8", 1.0),
    ("8", "9", 0.0),
    ("8", "", 0.0),
    ("8", "8.0", 1.0),
    ("8", "<answer>8</answer>", 1.0),
    ("8", "<think>5 + 3 is 8, not 7</think>\n<answer> 8 </answer>", 1.0),
    ("8", "<answer>9</answer> changed my mind <answer>8</answer>", 1.0),  # the last tag counts
    ("8", "<answer>8</answer><answer>9</answer>", 0.0),
    ("-2", "-2", 1.0),
    ("1.5", "3/2", 1.0),
    ("8", "%%$#@!garbage<<>>", 0.0),
    ("8", "<answer></answer>", 0.0),
    ("8", "\x00\xff\ufffd", 0.0),
]


@pytest.mark.parametrize(("gold", "response", "expected"), CASES)
def test_accuracy_reward(gold: str, response: str, expected: float) -> None:
    assert accuracy_reward(gold, response) == expected


@pytest.mark.parametrize(
    "response", ["8" * 50_000, "x" * 200_000, "10**10**10", "9^9^9^9", "(10^9)!", None, 8]
)
def test_pathological_input_is_zero_and_fast(response) -> None:
    start = time.monotonic()
    assert accuracy_reward("8", response) == (1.0 if response == 8 else 0.0)  # int 8 is coerced
    assert time.monotonic() - start < 5


def test_non_math_gold_falls_back_to_exact_match() -> None:
    assert accuracy_reward("Paris", "<answer>paris.</answer>") == 1.0
    assert accuracy_reward("Paris", "London") == 0.0


def test_works_from_a_worker_thread() -> None:
    results: list[float] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.extend(accuracy_reward(g, r) for g, r, _ in CASES)
            results.append(accuracy_reward("8", "10**10**10"))
        except BaseException as exc:  # surfaced below; a thread swallows exceptions otherwise
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors
    assert results == [expected for _, _, expected in CASES] + [0.0]


def test_extract_answer() -> None:
    assert extract_answer("a <answer> 1 </answer> b <answer>2</answer>") == "2"
    assert extract_answer("no tags here ") == "no tags here"
    assert extract_answer("<answer>unterminated") == "<answer>unterminated"
    assert extract_answer("<answer>multi\nline</answer>") == "multi\nline"


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("The Cat", "cat", 1.0),
        ("Paris", "  paris!! ", 1.0),
        ("new york", "New   York.", 1.0),
        ("Paris", "London", 0.0),
        ("a", "the", 0.0),  # nothing left after normalization is never a match
        ("8", "<answer>8</answer>", 1.0),
    ],
)
def test_normalized_exact_match(gold: str, response: str, expected: float) -> None:
    assert normalized_exact_match(gold, response) == expected


def test_registered() -> None:
    assert REWARD_FUNCTIONS.get("math_verify") is accuracy_reward
    assert REWARD_FUNCTIONS.get("exact_match") is normalized_exact_match
