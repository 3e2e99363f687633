"""DAPO's overlong reward shaping and group filter, and TRR++ (per task type x role baselines)."""

from __future__ import annotations

import math

import pytest
import torch

import nemo_azr.algorithms  # noqa: F401  (registers the estimators)
from nemo_azr.algorithms.dapo import (
    apply_overlong_penalty,
    first_groups,
    informative_rows,
    num_groups,
    overlong_penalty,
    retag_round,
)
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.registry import ADVANTAGE_ESTIMATORS


def test_overlong_penalty_by_hand():
    # max 20, buffer 4: no penalty up to 16 tokens, then (16 - L) / 4: 17 -> -0.25, 18 -> -0.5, 20 -> -1
    lengths = torch.tensor([5, 16, 17, 18, 20])
    out = overlong_penalty(lengths, max_len=20, buffer_len=4, factor=1.0)
    assert out.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, max_len=20, buffer_len=4, factor=0.5).tolist() == [
        0,
        0,
        -0.125,
        -0.25,
        -0.5,
    ]


def test_apply_overlong_penalty_uses_trained_tokens_and_the_buffer_fraction():
    mask = torch.zeros(3, 12)
    mask[0, 2:12] = 1  # 10 trained tokens: the limit
    mask[1, 2:11] = 1  # 9
    mask[2, 2:6] = 1  # 4
    batch = Batch({F.LOSS_MASK: mask, F.REWARDS: torch.tensor([1.0, 1.0, 0.0])}, {F.GROUP_ID: [0, 0, 1]})
    cfg = AlgorithmConfig(overlong_buffer_frac=0.25)  # buffer round(2.5) = 2 tokens of max_len 10
    metrics = apply_overlong_penalty(batch, cfg, max_len=10)
    assert batch[F.REWARDS].tolist() == [0.0, 0.5, 0.0]  # -1 at the limit, -0.5 one token before
    assert metrics == {
        "dapo/overlong_penalty_mean": pytest.approx(-0.5),
        "dapo/overlong_frac": pytest.approx(2 / 3),
    }
    untouched = Batch({F.LOSS_MASK: mask, F.REWARDS: torch.ones(3)}, {F.GROUP_ID: [0, 0, 1]})
    assert apply_overlong_penalty(untouched, AlgorithmConfig(), max_len=10) == {}
    assert untouched[F.REWARDS].tolist() == [1.0, 1.0, 1.0]


def test_informative_rows_drop_groups_of_equal_rewards_by_id():
    # groups by id, interleaved: a = [1, 0] (kept), b = [1, 1] (dropped), c = [0, 0, 0] (dropped), d = [0.5, 0]
    ids = ["a", "b", "c", "a", "b", "c", "c", "d", "d"]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.0])
    batch = Batch({F.REWARDS: rewards}, {F.GROUP_ID: ids, F.UID: [f"u{i}" for i in range(9)]})
    assert informative_rows(batch) == [0, 3, 7, 8]
    kept = batch.index(informative_rows(batch))
    assert num_groups(kept) == 2 and num_groups(batch) == 4
    assert first_groups(kept, 1).meta[F.GROUP_ID] == ["a", "a"]
    retagged = retag_round(kept, 2)
    assert (
        retagged.meta[F.GROUP_ID] == ["a-ds2", "a-ds2", "d-ds2", "d-ds2"]
        and retagged.meta[F.UID][0] == "u0-ds2"
    )


def test_trr_plus_plus_normalises_per_task_type_and_role():
    # (deduction, solver): [1, 0, 0, 1] -> +-1; (deduction, proposer): [1.0, -0.5] -> +-1;
    # (induction, solver): [1, 1] -> 0 (no spread). Prompts (group_id) are ignored.
    types = ["deduction"] * 4 + ["deduction", "deduction"] + ["induction", "induction"]
    roles = ["solver"] * 4 + ["proposer", "proposer"] + ["solver", "solver"]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, -0.5, 1.0, 1.0])
    batch = Batch(
        {F.REWARDS: rewards, F.LOSS_MASK: torch.ones(8, 2)},
        {F.GROUP_ID: [f"p{i}" for i in range(8)], F.ROLE: roles, "task_type": types},
    )
    adv, _ = ADVANTAGE_ESTIMATORS.get("trr_plus_plus")(batch, AlgorithmConfig(eps=1e-6))
    unit = 1 / (1 + 2e-6)  # 0.5 / (0.5 + 1e-6) and 0.75 / (0.75 + 1e-6), both ~1
    assert adv[:, 0].tolist() == pytest.approx([unit, -unit, -unit, unit, unit, -unit, 0.0, 0.0], rel=1e-5)
    assert ADVANTAGE_ESTIMATORS.get("trr++") is ADVANTAGE_ESTIMATORS.get("trr_plus_plus")
    centred, _ = ADVANTAGE_ESTIMATORS.get("trr_plus_plus")(batch, AlgorithmConfig(norm_by_std=False))
    assert centred[:6, 0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.75, -0.75])
    assert not math.isnan(float(adv.sum()))
