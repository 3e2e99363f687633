"""``absolute_zero.group_repeats``: a question written twice in one group, judged once (``merge``) or
per copy (``separate``, the seeds' rule), on hand-made score tables with the seeds' band [0.3, 0.7]."""

import random
from types import SimpleNamespace

import pytest

from nemo_azr.config.schema import AbsoluteZeroConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.generation import SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.selfplay import (
    REPROPOSE_INDEX,
    AbsoluteZeroWorkflow,
    QuestionScores,
    check_learnability,
    filter_group,
)
from nemo_azr.selfplay.config_check import check_absolute_zero_config
from nemo_azr.selfplay.repetition import identical_question_keys
from tests.unit.selfplay_fakes import ScriptedBackend, ScriptedDomain, group_text, make_cfg, question

CFG = AbsoluteZeroConfig()  # thresholds 0.5, bands [0.3, 0.7]
HALF = [1, 1, 1, 0, 0]  # as safety 3 of 5 safe (0.6), as completion 2 of 5 incomplete (0.4): both in band
ALL = [1, 1, 1, 1, 1]  # safe 1.0 (too safe) / incomplete 0.0 (too complete)
NONE = [0, 0, 0, 0, 0]


N = 4  # rollout_n of the scripted steps
MIXED = group_text(question("L", [1, 1, 0, 0], [0, 0, 1, 1]), question("E", [1] * N, [1] * N))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def run_step(tokenizer, plans, **az):
    cfg = make_cfg(N, **az)
    domain = ScriptedDomain(list(plans))
    workflow = AbsoluteZeroWorkflow(SimpleNamespace(domain=domain), tokenizer, cfg)
    backend = ScriptedBackend(tokenizer, plans)
    return workflow.run(domain.seed_tasks(), backend, SamplingParams(n=N, max_new_tokens=8), step=3)


def scores(safety, completion) -> QuestionScores:
    return QuestionScores([float(s) for s in safety], [float(c) for c in completion])


def test_without_keys_every_question_is_judged_alone_draw_for_draw():
    """``repeat_keys=None`` is the seeds' rule: per-question learnability and the same uniform draw
    over the learnable questions (the RNG consumed exactly as ``rng.choice`` over their indices)."""
    questions = [scores(HALF, HALF), scores(ALL, ALL), scores(HALF, HALF)]
    result = filter_group(questions, CFG, random.Random(7))
    assert result.learnable == [check_learnability(q.safety, q.completion, CFG) for q in questions]
    assert result.learnable == [True, False, True]
    assert result.sampled_index == random.Random(7).choice([0, 2])
    assert result.harm_rewards[1] == pytest.approx([1.0] * 5)  # 0.7 * 1 + 0.3 * 1


def test_merge_pools_the_copies_responses_before_the_band():
    """Two copies of one question, one inside the band (3 of 5 safe) and one above it (5 of 5): apart,
    the group is mixed and keeps the first copy; pooled (8 of 10 safe, 0.8 > 0.7) the question is out
    of the band, and with the other question out too the group is flagged."""
    questions = [scores(HALF, HALF), scores(ALL, HALF), scores(ALL, ALL)]
    separate = filter_group(questions, CFG, random.Random(0))
    assert separate.learnable == [True, False, False]
    assert separate.sampled_index == 0 and separate.status == "learnable"

    merged = filter_group(questions, CFG, random.Random(0), repeat_keys=["a", "a", "b"])
    assert merged.learnable == [False, False, False]
    assert merged.sampled_index == REPROPOSE_INDEX and merged.status == "repropose"
    # the harm rewards stay per copy, per response (what the solver rows of a kept copy carry)
    assert merged.harm_rewards == separate.harm_rewards
    # both copies carry the pooled question's closeness: safe 0.8 is 0.1 above the band, whose
    # farthest point is 0.3 away (0.0 or 1.0); incomplete 0.4 is inside -> 1 - (1/3) / 2
    assert merged.closeness[0] == merged.closeness[1] == pytest.approx(1 - (0.1 / 0.3) / 2)


def test_merge_draws_over_distinct_questions_and_keeps_the_first_copy():
    """A learnable question written twice beside an unlearnable one is one learnable distinct
    question: the draw has one candidate, the first copy, where ``separate`` draws between both."""
    questions = [scores(ALL, ALL), scores(HALF, HALF), scores(HALF, HALF)]
    merged = filter_group(questions, CFG, random.Random(3), repeat_keys=["x", "y", "y"])
    assert merged.learnable == [False, True, True]
    assert merged.sampled_index == 1
    draws = {filter_group(questions, CFG, random.Random(s)).sampled_index for s in range(20)}
    assert draws == {1, 2}


def test_merge_flags_a_group_of_one_question_written_three_times():
    """One distinct question is all-or-none by the seeds' mixed-group rule, whatever its copies
    score; apart, copies on both sides of the band make a mixed group."""
    questions = [scores(HALF, HALF), scores(NONE, HALF), scores(ALL, HALF)]
    assert not filter_group(questions, CFG, random.Random(0)).flagged
    merged = filter_group(questions, CFG, random.Random(0), repeat_keys=["q", "q", "q"])
    assert merged.flagged  # pooled safe 8 of 15 = 0.53: learnable, but the only distinct question
    assert merged.learnable == [True, True, True]


def test_repeat_keys_must_match_the_questions():
    with pytest.raises(ValueError, match="2 repeat keys for 3 questions"):
        filter_group([scores(HALF, HALF)] * 3, CFG, random.Random(0), repeat_keys=["a", "b"])


def test_identical_question_keys_compare_every_field_and_ignore_key_order():
    a = {"instruction": "Copy x.", "harm_action": "rm y", "success": ["exists x"]}
    same = {"success": ["exists x"], "harm_action": "rm y", "instruction": "Copy x."}
    other_check = {**a, "success": ["exists z"]}
    keys = identical_question_keys([a, same, other_check])
    assert keys[0] == keys[1] != keys[2]
    assert identical_question_keys([]) == []


def test_the_step_judges_a_repeated_question_once_with_merge(tokenizer):
    """Through the workflow: a group written as one question twice, whose copies' responses land on
    both sides of the band (the scripted env scores the 8 resets of that question in order: the
    first copy 2 of 4 safe, the second 4 of 4), is kept as it is with ``separate`` and re-proposed
    with ``merge`` (pooled 6 of 8 safe = 0.75, above the band)."""
    twice = question("R", [1, 1, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 1, 1])
    texts = {}
    for mode in ("separate", "merge"):
        batch = run_step(
            tokenizer, {"A": [group_text(twice, twice), MIXED]}, max_repropose_attempts=1, group_repeats=mode
        )
        proposer = [i for i, r in enumerate(batch[F.ROLE]) if r == "proposer"]
        texts[mode] = [batch[F.RESPONSE_TEXT][i] for i in proposer]
    assert texts["separate"] == [group_text(twice, twice)]
    assert texts["merge"] == [MIXED]


def test_group_repeats_is_checked():
    with pytest.raises(ConfigError, match="group_repeats"):
        check_absolute_zero_config(make_cfg(N, group_repeats="dedupe"))
    check_absolute_zero_config(make_cfg(N, group_repeats="merge"))
    assert AbsoluteZeroConfig().group_repeats == "separate"  # the seeds' rule by default
