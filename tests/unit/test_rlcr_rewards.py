"""RLCR rewards and parse rules: Brier, confidence parsing, answer accuracy (math and QA), formats."""

import math

import pytest

from nemo_azr.rlcr import (
    answer_accuracy,
    answer_format_ok,
    brier_reward,
    extract_answer_tag,
    parse_confidence,
    single_turn_format_ok,
    single_turn_reward,
    token_f1,
)


@pytest.mark.parametrize(
    ("acc", "conf", "expected"),
    [
        (1.0, 1.0, 1.0),
        (1.0, 0.0, 0.0),
        (0.0, 0.0, 1.0),
        (0.0, 1.0, 0.0),
        (1.0, 0.8, 1 - 0.2**2),  # 0.96
        (0.0, 0.8, 1 - 0.8**2),  # 0.36
        (0.0, 0.25, 1 - 0.0625),
        (1.0, 0.5, 0.75),
    ],
)
def test_brier_reward_hand_values(acc, conf, expected):
    assert brier_reward(acc, conf) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("conf", [None, -0.1, 1.01, math.nan, math.inf])
def test_brier_reward_failures_get_zero(conf):
    assert brier_reward(1.0, conf) == 0.0
    assert brier_reward(0.0, conf) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<confidence>0.7</confidence>", 0.7),
        ("<analysis>ok</analysis><confidence> 0.25 </confidence>", 0.25),
        ("<confidence>1</confidence>", 1.0),
        ("<confidence>0</confidence>", 0.0),
        ("<confidence>.5</confidence>", 0.5),
        ("<confidence>1.0</confidence>", 1.0),
        ("<confidence>-0</confidence>", 0.0),
        ("<confidence>0.1</confidence> then <confidence>0.9</confidence>", 0.9),  # last complete tag
        ("<confidence>0.3</confidence><confidence>oops", 0.3),  # an unclosed tag does not count
    ],
)
def test_parse_confidence_accepts(text, expected):
    assert parse_confidence(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0.7",  # no tag
        "<confidence>0.7",  # no closing tag
        "<confidence></confidence>",
        "<confidence>high</confidence>",  # not a number
        "<confidence>70%</confidence>",
        "<confidence>0.7 or 0.8</confidence>",
        "<confidence>nan</confidence>",
        "<confidence>inf</confidence>",
        "<confidence>1e-1</confidence>",
        "<confidence>1.5</confidence>",  # outside [0, 1]
        "<confidence>-0.2</confidence>",
        "<Confidence>0.5</Confidence>",  # tags are case-sensitive
    ],
)
def test_parse_confidence_rejects(text):
    assert parse_confidence(text) is None


def test_extract_answer_tag():
    assert extract_answer_tag("<think>x</think><answer> 7 </answer>") == "7"
    assert extract_answer_tag("<answer>1</answer><answer>2</answer>") == "2"
    assert extract_answer_tag("7") is None
    assert extract_answer_tag("<answer>7") is None


def test_answer_accuracy_math_needs_the_answer_tag():
    assert answer_accuracy("7", "<think>3 + 4</think><answer>7</answer>") == 1.0
    assert answer_accuracy("7", "<think>3 + 4</think><answer>7.0</answer>") == 1.0  # math-verify
    assert answer_accuracy("7", "<think>3 + 4</think><answer>8</answer>") == 0.0
    assert answer_accuracy("7", "7") == 0.0  # no tag: 0 (decision)
    assert answer_accuracy("7", "<answer></answer>") == 0.0


def test_answer_accuracy_qa_exact_and_f1():
    gold = "the Eiffel Tower"
    assert answer_accuracy(gold, "<answer>Eiffel tower.</answer>") == 1.0  # normalised exact match
    assert answer_accuracy(gold, "<answer>the tower</answer>") == 0.0
    # F1("tower", "eiffel tower") = 2 * 1 * 0.5 / 1.5 = 2/3
    assert token_f1(gold, "the tower") == pytest.approx(2 / 3)
    f1 = {"qa_match": "f1"}
    assert answer_accuracy(gold, "<answer>the tower</answer>", f1_threshold=0.6, **f1) == 1.0
    assert answer_accuracy(gold, "<answer>the tower</answer>", f1_threshold=0.7, **f1) == 0.0
    # answer_match=qa uses the QA rule even for a numeric gold
    assert answer_accuracy("7", "<answer>7.0</answer>", answer_match="qa") == 0.0
    assert answer_accuracy("7", "<answer>7.0</answer>", answer_match="math") == 1.0


def test_token_f1_edge_cases():
    assert token_f1("", "x") == 0.0
    assert token_f1("a b", "c d") == 0.0
    assert token_f1("Paris", "paris") == 1.0


def test_formats():
    good = "<think>3 + 4</think><answer>7</answer><analysis>sure</analysis><confidence>0.8</confidence>"
    assert answer_format_ok("<think>a</think>\n<answer>7</answer>")
    assert not answer_format_ok("<answer>7</answer>")
    assert not answer_format_ok("<answer>7</answer><think>a</think>")
    assert single_turn_format_ok(good)
    assert not single_turn_format_ok(good.replace("0.8", "2"))  # confidence must parse
    assert not single_turn_format_ok("<think>a</think><answer>7</answer><confidence>0.8</confidence>")
    assert not single_turn_format_ok("junk " + good)


def test_single_turn_reward_weights():
    weights = {"format_weight": 0.5, "accuracy_weight": 1.0, "brier_weight": 2.0}
    right = "<think>3 + 4</think><answer>7</answer><analysis>sure</analysis><confidence>0.8</confidence>"
    r = single_turn_reward("7", right, **weights)
    assert (r.format_ok, r.accuracy, r.confidence) == (True, 1.0, 0.8)
    assert r.brier == pytest.approx(0.96)
    assert r.total == pytest.approx(0.5 + 1.0 + 2 * 0.96)
    wrong = right.replace("<answer>7", "<answer>9")
    r = single_turn_reward("7", wrong, **weights)
    assert r.total == pytest.approx(0.5 + 0.0 + 2 * (1 - 0.64))
    broken = "<answer>7</answer>"  # no confidence: format 0, brier 0, accuracy still counts
    r = single_turn_reward("7", broken, **weights)
    assert (r.format_ok, r.accuracy, r.brier, r.total) == (False, 1.0, 0.0, 1.0)
