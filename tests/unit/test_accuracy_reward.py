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
    # This process's CPU time, not the wall clock: a loaded machine must not fail the test, while a
    # parser that evaluates 10**10**10 or backtracks over 200k characters still would.
    start = time.process_time()
    assert accuracy_reward("8", response) == (1.0 if response == 8 else 0.0)  # int 8 is coerced
    assert time.process_time() - start < 10


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
    assert extract_answer("no tags here ") is None  # never the whole text
    assert extract_answer("<answer>unterminated") is None
    assert extract_answer("<answer>multi\nline</answer>") == "multi\nline"
    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("The answer is Paris. It is big.") == "Paris"
    # numeric gold: the last number of the stated answer, or of the whole text
    assert extract_answer("17 + 25 = 42, I think", "42") == "42"
    assert extract_answer("The answer is 43 - 75 = -32.", "-32") == "-32"
    assert extract_answer("no digits", "3") is None


# Responses a real chat model writes (or a policy learns to write) to "What is 17 + 25?" (gold 42),
# scored as a person would score them.
ADVERSARIAL = [
    ("17 + 25 is a sum of two numbers.", 0.0),  # echo of the question: math-verify alone says 17+25 == 42
    ("What is 17 + 25?", 0.0),
    ("17 + 25", 0.0),
    ("<answer>17 + 25</answer>", 0.0),  # an unevaluated expression is not an answer
    ("\\boxed{17+25}", 0.0),
    ("41, 42, 43", 0.0),  # listing candidates: the last one is the answer
    ("<answer>41 or 42 or 43</answer>", 0.0),
    ("<answer>42</answer><answer>43</answer>", 0.0),
    ("The answer is 42 or maybe 43.", 0.0),
    ("17 + 25 = 42. Also, 2 + 2 = 4", 0.0),  # answer, then more text with numbers: the last number counts
    ("The answer is 42. Also, 2 + 2 = 4", 1.0),  # ... unless the answer is stated
    ("17 + 25 = 42.", 1.0),
    ("To add 17 and 25, we combine them: 17 + 25 = 42.\n\nSo the sum is 42.", 1.0),
    ("<think>17 + 25 = 43? no</think><answer>42</answer>", 1.0),
    ("\\boxed{42}", 1.0),
    ("Answer: 42", 1.0),
    ("42.0", 1.0),
    ("The result is 42 apples.", 1.0),
    ("4,2", 0.0),  # not a thousands separator
    ("-42", 0.0),
    ("It is 24.", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize(("response", "expected"), ADVERSARIAL)
def test_a_model_cannot_game_the_arithmetic_reward(response: str, expected: float) -> None:
    assert accuracy_reward("42", response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("-32", "43 - 75 = -32", 1.0),
        ("32", "75-43=32", 1.0),
        ("32", "the result is 75-43", 0.0),  # binary minus: reads as 43, not -43
        ("1234", "That makes 1,234 in all.", 1.0),
        ("0.75", "\\boxed{\\frac{3}{4}}", 1.0),
        ("3/4", "It is 0.75", 1.0),
        ("-7", "The answer is \u22127.", 1.0),  # unicode minus
        ("\\frac{\\pi}{2}", "so \\boxed{\\pi/2}", 1.0),  # non-numeric math gold: math-verify on the span
        ("\\frac{\\pi}{2}", "pi/2 is not it, it is \\frac{\\pi}{2} maybe", 0.0),  # no stated answer
        ("Paris", "Paris.", 1.0),  # a whole short reply is compared by exact match
        ("Paris", "The capital is Paris, I think", 0.0),
    ],
)
def test_answer_forms(gold: str, response: str, expected: float) -> None:
    assert accuracy_reward(gold, response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("The Cat", "cat", 1.0),
        ("Paris", "  paris!! ", 1.0),
        ("new york", "New   York.", 1.0),
        ("Paris", "London", 0.0),
        ("a", "the", 0.0),  # nothing left after normalization is never a match
        ("8", "<answer>8</answer>", 1.0),
        ("Paris", "The answer is Paris.", 1.0),
    ],
)
def test_normalized_exact_match(gold: str, response: str, expected: float) -> None:
    assert normalized_exact_match(gold, response) == expected


def test_registered() -> None:
    assert REWARD_FUNCTIONS.get("math_verify") is accuracy_reward
    assert REWARD_FUNCTIONS.get("exact_match") is normalized_exact_match
