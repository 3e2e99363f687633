"""The strict numeric answer reader: replies to arithmetic questions scored as a person would score
them, and why a reply earns nothing (the counted rejection reasons)."""

from fractions import Fraction

import pytest

from nemo_azr.rewards.accuracy import accuracy_with_reason, answer_matches
from nemo_azr.rewards.answer_extraction import (
    NO_ANSWER,
    PROSE_THRESHOLD,
    SEVERAL_CANDIDATES,
    UNMARKED,
    candidates,
    read_numeric_answer,
)

ADD = ("What is 48 + 87?", "135")
SUB = ("What is 93 - 13?", "80")
ECHO = ("What is 84 - 42?", "42")  # a - b = b: an echo of the question ends with the gold number

# (question, gold, reply, the score a person gives, the reason when it is 0 for want of an answer)
TABLE = [
    # bare answers
    (*ADD, "135", 1.0, ""),
    (*ADD, "135.", 1.0, ""),
    (*ADD, "**135**", 1.0, ""),
    (*ADD, "  135!  ", 1.0, ""),
    (*ADD, "134", 0.0, ""),
    (*SUB, "-80", 0.0, ""),
    (*SUB, "80.0", 1.0, ""),
    # tags and boxes
    (*ADD, "<answer>135</answer>", 1.0, ""),
    (*ADD, "<think>48 + 87 = 134? no</think><answer>135</answer>", 1.0, ""),
    (*ADD, "\\boxed{135}", 1.0, ""),
    (*ADD, "The sum is \\boxed{48 + 87 = 135}.", 1.0, ""),
    (*ADD, "<answer>48 + 87</answer>", 0.0, SEVERAL_CANDIDATES),  # an expression, not a result
    (*ADD, "<answer></answer>", 0.0, NO_ANSWER),
    # hedges and lists
    (*ADD, "The answer is 134 or 135.", 0.0, SEVERAL_CANDIDATES),
    (*ADD, "\\boxed{135 or 136}", 0.0, SEVERAL_CANDIDATES),
    (*ADD, "<answer>10 135</answer>", 0.0, SEVERAL_CANDIDATES),
    (*ADD, "133 134 135", 0.0, SEVERAL_CANDIDATES),
    (*ADD, "134 or 135", 0.0, SEVERAL_CANDIDATES),
    (*ADD, "It could be 134, 135 or 136.", 0.0, UNMARKED),
    (*ADD, "The answer is 135 or 135.", 1.0, ""),  # one distinct candidate
    # echoes of the question
    (*ECHO, "84 - 42", 0.0, SEVERAL_CANDIDATES),
    (*ECHO, "What is 84 - 42?", 0.0, SEVERAL_CANDIDATES),
    (*ECHO, "<answer>84 - 42</answer>", 0.0, SEVERAL_CANDIDATES),
    (*ADD, "48 + 87 is a sum of two numbers.", 0.0, ""),  # "two" is its stated result: wrong, not empty
    (*ECHO, "84 - 42 = 42", 1.0, ""),  # the restated equation with its result is an answer
    # restated equations and stated results
    (*ADD, "48 + 87 = 135", 1.0, ""),
    (*ADD, "To add them: 48 + 87 = 135.\n\nSo the sum is 135.", 1.0, ""),
    (*ADD, "48 + 87 is 135, an increase of 87 over 48.", 1.0, ""),
    (*ADD, "The result is 135 apples.", 1.0, ""),
    (*ADD, "I think it's 135", 1.0, ""),
    (*ADD, "48 + 87 = 135. Also, 2 + 2 = 4", 1.0, ""),  # it restates the question with one result
    ("What is 17 + 25?", "42", "48 + 87 = 135. Also, 2 + 2 = 4", 0.0, ""),  # not this question's: the last, 4
    (*ADD, "The answer is 135. Also, 2 + 2 = 4", 1.0, ""),  # a marked answer wins
    (*ADD, "Adding 48 and 87 gives a big number.", 0.0, UNMARKED),
    (*ADD, "I am not sure.", 0.0, NO_ANSWER),
    (*ADD, "", 0.0, NO_ANSWER),
    # words for numbers
    (*ADD, "The answer is one hundred thirty-five.", 1.0, ""),
    (*ADD, "one hundred and thirty-five", 1.0, ""),
    (*ADD, "The answer is 135 (one hundred thirty-five).", 1.0, ""),
    (*SUB, "The answer is eighty.", 1.0, ""),
    ("What is 3 - 2?", "1", "The answer is one.", 1.0, ""),
    ("What is 3 - 2?", "1", "No one knows.", 0.0, NO_ANSWER),
    ("What is 13 - 93?", "-80", "The answer is minus eighty.", 1.0, ""),
    # negative numbers, fractions, separators
    ("What is 13 - 93?", "-80", "13 - 93 = -80", 1.0, ""),
    ("What is 13 - 93?", "-80", "The answer is \u221280.", 1.0, ""),
    ("What is 13 - 93?", "-80", "80", 0.0, ""),
    ("What is 1200 + 34?", "1234", "That makes 1,234 in all.", 1.0, ""),
    ("What is 3 / 4?", "0.75", "\\boxed{\\frac{3}{4}}", 1.0, ""),
    ("What is 3 / 4?", "3/4", "It is 0.75", 1.0, ""),
    # trailing text after a stated answer
    (*SUB, "The answer is 80. Let me know if you need anything else!", 1.0, ""),
    (*SUB, "Answer: 80\nHope this helps.", 1.0, ""),
]


def test_the_table_is_large_enough():
    assert len(TABLE) >= 40


@pytest.mark.parametrize(("question", "gold", "reply", "score", "reason"), TABLE)
def test_replies_score_as_a_person_would(question, gold, reply, score, reason):
    got, why = accuracy_with_reason(gold, reply, question)
    assert got == score
    assert why == reason


def test_a_restated_question_needs_the_question():
    reply = "48 + 87 is 135, an increase of 18."  # its last statement is "an increase of 18"
    assert accuracy_with_reason("135", reply, "What is 48 + 87?") == (1.0, "")
    assert accuracy_with_reason("135", reply)[0] == 0.0


def test_two_different_results_for_the_question_are_a_hedge():
    reply = "48 + 87 is 135, or maybe 48 + 87 is 136."
    assert accuracy_with_reason("135", reply, "What is 48 + 87?") == (0.0, SEVERAL_CANDIDATES)


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("zero", [0]),
        ("forty-two", [42]),
        ("one hundred and five", [105]),
        ("two thousand three hundred", [2300]),
        ("minus seven", [-7]),
        ("negative twelve", [-12]),
        ("41 or forty-two", [41, 42]),
        ("42 (forty-two)", [42]),
        ("apples", []),
    ],
)
def test_candidates_read_literals_and_words(text, values):
    assert candidates(text) == [Fraction(v) for v in values]


def test_prose_keeps_one_as_a_word():
    assert candidates("no one knows, it is one of them", threshold=PROSE_THRESHOLD) == []


def test_rlcr_answers_are_read_strictly_too():
    """RLCR compares its <answer> span with answer_matches: a hedged span scores 0 there as well."""
    assert answer_matches("42", "42") == 1.0
    assert answer_matches("42", "41 or 42") == 0.0
    assert answer_matches("42", "17 + 25 = 42") == 1.0
    assert read_numeric_answer("10 42").reason == SEVERAL_CANDIDATES


def test_the_reward_stage_counts_why_replies_earned_nothing():
    from nemo_azr.config.schema import DataConfig
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.task import Example
    from nemo_azr.tasks.arithmetic import ArithmeticTask
    from nemo_azr.trainer.rewards import score_batch

    task = ArithmeticTask(DataConfig())
    ex = Example("p0", "What is 48 + 87?", "135")
    replies = [
        "135",
        "134 or 135",
        "<answer>1 2</answer>",
        "no idea",
        "48 + 87 is 135, plus change",
        "7",
        "I added 4 things",
    ]
    batch = score_batch(Batch(meta={"example": [ex] * len(replies), F.RESPONSE_TEXT: replies}), task)
    assert batch[F.REWARDS].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert batch.info["answer_rejections"] == {NO_ANSWER: 1, SEVERAL_CANDIDATES: 2, UNMARKED: 1}
