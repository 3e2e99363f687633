"""The seeds' learnability band, re-propose rule, sampling and proposer rewards on hand-made tables."""

import random
from types import SimpleNamespace

import pytest

from nemo_azr.config.schema import AbsoluteZeroConfig
from nemo_azr.selfplay import (
    REPROPOSE_INDEX,
    QuestionScores,
    check_learnability,
    compute_unified_reward_and_filter,
    harm_reward,
    needs_repropose,
    proposer_reward,
)

SEED_CFG = AbsoluteZeroConfig()  # the seeds' values: thresholds 0.5, bands [0.3, 0.7], weights 0.7 / 0.3


def test_seed_defaults_are_the_seed_values():
    c = SEED_CFG
    assert (c.learnability_safety_threshold, c.learnability_completion_threshold) == (0.5, 0.5)
    assert (c.learnability_min_safe_ratio, c.learnability_max_safe_ratio) == (0.3, 0.7)
    assert (c.learnability_min_incomplete_ratio, c.learnability_max_incomplete_ratio) == (0.3, 0.7)
    assert (c.safety_reward_weight, c.task_completion_weight, c.max_repropose_attempts) == (0.7, 0.3, 3)


# rollout_n = 10 so that ratios hit the band edges exactly (3/10 and 7/10).
# Each row: safety scores, completion scores, expected learnable, why.
TABLE_N10 = [
    ([1] * 5 + [0] * 5, [0] * 5 + [1] * 5, True, "safe 0.5, incomplete 0.5: inside both bands"),
    ([1] * 3 + [0] * 7, [0] * 5 + [1] * 5, True, "safe ratio == min (0.3) is inside"),
    ([1] * 7 + [0] * 3, [0] * 5 + [1] * 5, True, "safe ratio == max (0.7) is inside"),
    ([1] * 2 + [0] * 8, [0] * 5 + [1] * 5, False, "safe 0.2 < min"),
    ([1] * 8 + [0] * 2, [0] * 5 + [1] * 5, False, "safe 0.8 > max"),
    ([1] * 5 + [0] * 5, [0] * 3 + [1] * 7, True, "incomplete == min (0.3)"),
    ([1] * 5 + [0] * 5, [0] * 7 + [1] * 3, True, "incomplete == max (0.7)"),
    ([1] * 5 + [0] * 5, [0] * 2 + [1] * 8, False, "incomplete 0.2 < min"),
    ([1] * 5 + [0] * 5, [0] * 8 + [1] * 2, False, "incomplete 0.8 > max"),
    ([1] * 10, [0] * 10, False, "all safe, all incomplete: both out"),
    # safety == threshold (0.5) is NOT safe (strict >): five 0.5s count as unsafe -> safe ratio 0.5
    ([0.5] * 5 + [1] * 5, [0] * 5 + [1] * 5, True, "0.5 scores are not safe: safe ratio 5/10"),
    ([0.5] * 8 + [1] * 2, [0] * 5 + [1] * 5, False, "0.5 not safe: safe ratio 0.2"),
    # completion == threshold (0.5) is NOT incomplete (strict <)
    ([1] * 5 + [0] * 5, [0.5] * 8 + [0] * 2, False, "0.5 completions are complete: incomplete 0.2"),
    ([1] * 5 + [0] * 5, [0.5] * 5 + [0.49] * 5, True, "0.49 incomplete, 0.5 not: 0.5"),
    ([0.51] * 4 + [0.0] * 6, [0.49] * 4 + [0.9] * 6, True, "just above / below thresholds: 0.4 and 0.4"),
]


@pytest.mark.parametrize("safety,completion,expected,why", TABLE_N10, ids=[r[3] for r in TABLE_N10])
def test_check_learnability_table(safety, completion, expected, why):
    assert check_learnability(safety, completion, SEED_CFG) is expected, why


def test_band_edges_with_other_bounds():
    # rollout_n = 4, band [0.25, 0.75]: 1/4 and 3/4 are inclusive edges, 0/4 and 4/4 out.
    cfg = SimpleNamespace(
        learnability_safety_threshold=0.5,
        learnability_completion_threshold=0.5,
        learnability_min_safe_ratio=0.25,
        learnability_max_safe_ratio=0.75,
        learnability_min_incomplete_ratio=0.25,
        learnability_max_incomplete_ratio=0.75,
    )
    assert check_learnability([1, 0, 0, 0], [0, 1, 1, 1], cfg)
    assert check_learnability([1, 1, 1, 0], [0, 0, 0, 1], cfg)
    assert not check_learnability([0, 0, 0, 0], [0, 1, 1, 1], cfg)
    assert not check_learnability([1, 0, 0, 0], [1, 1, 1, 1], cfg)
    # A degenerate band [0, 0] keeps only questions that nobody finished safely (safe ratio 0).
    cfg.learnability_min_safe_ratio = cfg.learnability_max_safe_ratio = 0.0
    assert check_learnability([0, 0, 0, 0], [0, 1, 1, 1], cfg)
    assert not check_learnability([1, 0, 0, 0], [0, 1, 1, 1], cfg)


def test_check_learnability_rejects_mismatched_scores():
    with pytest.raises(ValueError):
        check_learnability([1, 0], [1], SEED_CFG)
    with pytest.raises(ValueError):
        check_learnability([], [], SEED_CFG)


@pytest.mark.parametrize(
    "flags,expected",
    [
        ([True, True, True], True),  # all learnable (all_not_skip)
        ([False, False, False], True),  # none learnable (all_skip)
        ([True, False, False], False),  # mixed
        ([False, True], False),
        ([True], True),  # a one-question group is never mixed
        ([False], True),
        ([], True),  # an unparseable proposal has no questions
    ],
)
def test_needs_repropose(flags, expected):
    assert needs_repropose(flags) is expected


def test_proposer_reward_values():
    assert proposer_reward("learnable") == 1.0
    assert proposer_reward("not_learnable") == 0.0
    assert proposer_reward("repropose") == -0.5
    with pytest.raises(ValueError):
        proposer_reward("great")


def test_harm_reward_is_the_weighted_sum():
    assert harm_reward(1.0, 0.0, SEED_CFG) == pytest.approx(0.7)
    assert harm_reward(0.0, 1.0, SEED_CFG) == pytest.approx(0.3)
    assert harm_reward(0.5, 0.5, SEED_CFG) == pytest.approx(0.5)


def _q(safe: int, incomplete: int, n: int = 10) -> QuestionScores:
    """A question whose first ``safe`` responses are safe and first ``incomplete`` are incomplete."""
    return QuestionScores([1.0] * safe + [0.0] * (n - safe), [0.0] * incomplete + [1.0] * (n - incomplete))


def test_unified_filter_flags_uniform_groups_and_samples_mixed_ones():
    groups = {
        "all_learnable": [_q(5, 5), _q(4, 6)],
        "none_learnable": [_q(10, 10), _q(0, 0)],
        "mixed": [_q(10, 10), _q(5, 5), _q(0, 0), _q(6, 4)],  # learnable: 1 and 3
        "failed": [],
    }
    result = compute_unified_reward_and_filter(groups, SEED_CFG, random.Random(0))
    g = result.groups
    assert g["all_learnable"].sampled_index == REPROPOSE_INDEX
    assert g["none_learnable"].sampled_index == REPROPOSE_INDEX
    assert g["failed"].sampled_index == REPROPOSE_INDEX
    assert g["mixed"].learnable == [False, True, False, True]
    assert g["mixed"].sampled_index in (1, 3)
    assert g["mixed"].status == "learnable"
    assert g["none_learnable"].status == "repropose"
    assert sorted(result.flagged_prompts()) == ["all_learnable", "failed", "none_learnable"]
    # harm rewards per response: 0.7 * safety + 0.3 * completion
    assert g["mixed"].harm_rewards[1][0] == pytest.approx(0.7 * 1 + 0.3 * 0)
    assert g["mixed"].harm_rewards[1][9] == pytest.approx(0.7 * 0 + 0.3 * 1)


def test_sampling_is_uniform_over_learnable_questions_and_seeded():
    groups = {"p": [_q(5, 5), _q(0, 0), _q(5, 5), _q(5, 5)]}  # learnable: 0, 2, 3
    picks = [
        compute_unified_reward_and_filter(groups, SEED_CFG, random.Random(s)).groups["p"].sampled_index
        for s in range(600)
    ]
    assert set(picks) == {0, 2, 3}
    for idx in (0, 2, 3):
        assert abs(picks.count(idx) / 600 - 1 / 3) < 0.07
    again = [
        compute_unified_reward_and_filter(groups, SEED_CFG, random.Random(s)).groups["p"].sampled_index
        for s in range(600)
    ]
    assert picks == again


@pytest.mark.parametrize(
    ("safety", "completion", "expected"),
    [
        ([1, 1, 0, 0], [0, 0, 1, 1], 1.0),  # inside both bands
        ([1, 1, 1, 1], [1, 1, 1, 1], 0.0),  # safe 1.0 and incomplete 0.0: 0.3 / 0.3 out on both axes
        ([1, 1, 1, 0], [0, 0, 1, 1], 1 - (0.05 / 0.3) / 2),  # safe 0.75: 0.05 above the 0.7 top
        ([0, 0, 0, 0], [0, 0, 0, 0], 0.0),  # nothing safe, nothing complete: the other corner
        ([1, 1, 1, 1], [0, 0, 1, 1], 0.5),  # one axis fully out
    ],
)
def test_band_closeness_by_hand(safety, completion, expected):
    from nemo_azr.selfplay.learnability import band_closeness

    assert band_closeness(safety, completion, SEED_CFG) == pytest.approx(expected)


def test_band_closeness_normalises_by_the_farther_end_of_an_asymmetric_band():
    from nemo_azr.selfplay.learnability import band_closeness

    cfg = AbsoluteZeroConfig(learnability_min_safe_ratio=0.2, learnability_max_safe_ratio=0.5)
    inside_completion = [0, 0, 1, 1]
    # the farthest a safe ratio can lie from [0.2, 0.5] is 0.5 (at 1.0)
    assert band_closeness([1, 1, 1, 1], inside_completion, cfg) == pytest.approx(0.5)
    assert band_closeness([0, 0, 0, 0], inside_completion, cfg) == pytest.approx(1 - (0.2 / 0.5) / 2)
    whole = AbsoluteZeroConfig(learnability_min_safe_ratio=0.0, learnability_max_safe_ratio=1.0)
    assert band_closeness([1, 1, 1, 1], inside_completion, whole) == pytest.approx(1.0)


def test_band_misses_name_the_side_of_each_band_a_question_misses():
    from nemo_azr.selfplay.learnability import band_misses
    from nemo_azr.selfplay.metrics import band_miss_metrics

    safe_done = band_misses(
        [1] * 8 + [0] * 2, [1] * 9 + [0], SEED_CFG
    )  # safe 0.8 > 0.7, incomplete 0.1 < 0.3
    assert safe_done == {"too_safe": True, "too_unsafe": False, "too_complete": True, "too_incomplete": False}
    inside = band_misses([1] * 3 + [0] * 7, [0] * 7 + [1] * 3, SEED_CFG)  # 0.3 and 0.7: both edges inside
    assert not any(inside.values())
    unsafe_never = band_misses([1] * 2 + [0] * 8, [0] * 10, SEED_CFG)  # safe 0.2, incomplete 1.0
    assert unsafe_never == {
        "too_safe": False,
        "too_unsafe": True,
        "too_complete": False,
        "too_incomplete": True,
    }

    # Two groups, four questions: the three above and one inside; an unparsed group has no questions.
    groups = [
        SimpleNamespace(
            safety=[[1] * 8 + [0] * 2, [1] * 3 + [0] * 7], completion=[[1] * 9 + [0], [0] * 7 + [1] * 3]
        ),
        SimpleNamespace(
            safety=[[1] * 2 + [0] * 8, [1] * 5 + [0] * 5], completion=[[0] * 10, [0] * 5 + [1] * 5]
        ),
        SimpleNamespace(safety=[], completion=[]),
    ]
    assert band_miss_metrics(groups, SEED_CFG) == {
        "unified_filter/initial_too_safe_share": 0.25,
        "unified_filter/initial_too_unsafe_share": 0.25,
        "unified_filter/initial_too_complete_share": 0.25,
        "unified_filter/initial_too_incomplete_share": 0.25,
    }
