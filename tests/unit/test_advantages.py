"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

import nemo_azr.algorithms  # noqa: F401  (registers the estimators)
from nemo_azr.algorithms.advantages import rewards_at_last_token, sequence_rewards
from nemo_azr.algorithms.grouping import group_index, group_mean, group_range, group_size, group_std
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.contracts.batch import Batch
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.registry import ADVANTAGE_ESTIMATORS

EPS = 1e-6


def _batch(rewards, group_id=None, mask=None, t=3, **tensors) -> Batch:
    rewards = torch.tensor(rewards, dtype=torch.float32)
    if mask is None:
        mask = torch.ones(len(rewards), t)
    else:
        mask = torch.tensor(mask, dtype=torch.float32)
    meta = {} if group_id is None else {"group_id": list(group_id)}
    return Batch(tensors={"rewards": rewards, "loss_mask": mask, **tensors}, meta=meta)


def _run(name: str, batch: Batch, **cfg):
    return ADVANTAGE_ESTIMATORS.get(name)(batch, AlgorithmConfig(eps=EPS, **cfg))


def _rows(advantages: torch.Tensor) -> list[float]:
    """First column (all-ones masks) as a list."""
    return advantages[:, 0].tolist()


# --- grouping ------------------------------------------------------------------------------------


def test_group_index_dense_by_first_occurrence():
    assert group_index(["q7", "q2", "q7", 5, "q2"]).tolist() == [0, 1, 0, 2, 1]


def test_group_helpers_by_hand():
    # values [1, 4, 3, 10, 5] in groups [0, 1, 0, 2, 1]:
    # g0 = {1, 3}: mean 2, pop std 1; g1 = {4, 5}: mean 4.5, pop std .5; g2 = {10}: mean 10, std 0.
    values = torch.tensor([1.0, 4.0, 3.0, 10.0, 5.0])
    index = torch.tensor([0, 1, 0, 2, 1])
    assert group_size(index, 3).tolist() == [2, 2, 1]
    assert group_mean(values, index, 3).tolist() == [2.0, 4.5, 10.0]
    assert group_std(values, index, 3).tolist() == [1.0, 0.5, 0.0]
    assert group_range(values, index, 3).tolist() == [2.0, 1.0, 0.0]


# --- grpo ----------------------------------------------------------------------------------------


def test_grpo_groups_by_id_not_by_row_order():
    # ids [a, b, a, b]: group a = rows 0, 2 = {1, 0}: mean .5, pop std .5 -> A = +-.5 / (.5 + eps)
    #                   group b = rows 1, 3 = {3, 1}: mean 2,  pop std 1  -> A = +-1 / (1 + eps)
    # (grouping adjacent pairs instead would give rows 0, 1 = {1, 3} -> A_0 = -1.)
    adv, ret = _run("grpo", _batch([1.0, 3.0, 0.0, 1.0], ["a", "b", "a", "b"]))
    a, b = 0.5 / (0.5 + EPS), 1.0 / (1.0 + EPS)
    assert _rows(adv) == pytest.approx([a, b, -a, -b], rel=1e-6)
    assert adv.dtype == torch.float32
    assert torch.equal(ret, adv)


def test_grpo_group_of_four_uses_population_std():
    # [1, 0, 0, 1]: mean .5; pop var = 4 * .25 / 4 = .25 -> std .5 -> A = +-1/(.5+eps) ~ +-2
    # (sample std sqrt(1/3) = .577 would give +-.866).
    adv, _ = _run("grpo", _batch([1.0, 0.0, 0.0, 1.0], ["g"] * 4))
    a = 0.5 / (0.5 + EPS)
    assert _rows(adv) == pytest.approx([a, -a, -a, a], rel=1e-6)


def test_grpo_group_of_three_population_std():
    # [3, 0, 0]: mean 1; deviations [2, -1, -1]; pop var (4+1+1)/3 = 2 -> std sqrt(2)
    # A = [2/sqrt2, -1/sqrt2, -1/sqrt2] = [1.41421, -.70711, -.70711]
    adv, _ = _run("grpo", _batch([3.0, 0.0, 0.0], [0, 0, 0]))
    s = math.sqrt(2.0) + EPS
    assert _rows(adv) == pytest.approx([2 / s, -1 / s, -1 / s], rel=1e-6)


def test_grpo_singleton_and_zero_spread_groups_are_zero():
    # group "solo" has one row -> 0; group "same" = {.1, .1, .1} -> 0 exactly (rounding of the mean
    # must not be blown up by 1/eps); group "x" = {2, 0} -> +-1/(1+eps).
    adv, _ = _run("grpo", _batch([0.7, 0.1, 2.0, 0.1, 0.0, 0.1], ["solo", "same", "x", "same", "x", "same"]))
    a = 1.0 / (1.0 + EPS)
    assert _rows(adv) == pytest.approx([0.0, 0.0, a, 0.0, -a, 0.0], rel=1e-6)
    assert adv[[0, 1, 3, 5]].abs().max().item() == 0.0


def test_grpo_zero_spread_is_exactly_zero_for_float64_rewards():
    # float64 .1 * 3 = .30000000000000004 -> mean .10000000000000002: r - mean = -1.4e-17, which the
    # 1/(std + eps) scaling would turn into ~1e-11; a constant group must give exactly 0 instead.
    batch = Batch(
        tensors={"rewards": torch.full((3,), 0.1, dtype=torch.float64), "loss_mask": torch.ones(3, 2)},
        meta={"group_id": [0, 0, 0]},
    )
    adv, _ = _run("grpo", batch)
    assert adv.abs().max().item() == 0.0


def test_grpo_without_std_normalisation():
    # group {4, 1, 1}: mean 2 -> A = [2, -1, -1]; group {5} -> 0
    adv, _ = _run("grpo", _batch([4.0, 5.0, 1.0, 1.0], [0, 1, 0, 0]), norm_by_std=False)
    assert _rows(adv) == pytest.approx([2.0, 0.0, -1.0, -1.0])


def test_grpo_masked_tokens_get_zero():
    # group {1, 0}: A = +-.5/(.5+eps) ~ +-1, written only where loss_mask == 1 (bool mask accepted).
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    batch = Batch(
        tensors={"rewards": torch.tensor([1.0, 0.0]), "loss_mask": mask}, meta={"group_id": ["p", "p"]}
    )
    adv, _ = _run("grpo", batch)
    a = 0.5 / (0.5 + EPS)
    expected = torch.tensor([[0.0, a, a, 0.0], [-a, -a, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    assert (adv[~mask] == 0).all()


def test_grpo_uses_token_rewards_when_present():
    # token_rewards sums: row0 = .5 + .5 = 1, row1 = 0 -> same as rewards [1, 0]; the stale
    # "rewards" [0, 0] (zero spread -> A = 0) must be ignored.
    token_rewards = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]])
    batch = _batch([0.0, 0.0], ["g", "g"], token_rewards=token_rewards)
    adv, _ = _run("grpo", batch)
    a = 0.5 / (0.5 + EPS)
    assert _rows(adv) == pytest.approx([a, -a], rel=1e-6)


def test_grpo_missing_group_id():
    with pytest.raises(BatchContractError, match="grpo.*group_id"):
        _run("grpo", _batch([1.0, 0.0]))


# --- rloo ----------------------------------------------------------------------------------------


def test_rloo_interleaved_and_singleton():
    # ids [a, b, a, c, a, a]; group a = rows 0, 2, 4, 5 = {1, 0, 0, 1}, sum 2:
    #   A_0 = 1 - (2-1)/3 = 2/3, A_2 = 0 - 2/3 = -2/3, A_4 = -2/3, A_5 = 2/3
    # group b = row 1 alone -> 0; group c = row 3 alone -> 0.
    adv, ret = _run("rloo", _batch([1.0, 9.0, 0.0, -4.0, 0.0, 1.0], list("abacaa")))
    assert _rows(adv) == pytest.approx([2 / 3, 0.0, -2 / 3, 0.0, -2 / 3, 2 / 3])
    assert torch.equal(ret, adv)


def test_rloo_group_of_two_and_mask():
    # {5, 2}: A = 5 - 2 = 3 and 2 - 5 = -3, on masked tokens only.
    adv, _ = _run("rloo", _batch([5.0, 2.0], [1, 1], mask=[[1, 0, 1], [0, 0, 1]]))
    torch.testing.assert_close(adv, torch.tensor([[3.0, 0.0, 3.0], [0.0, 0.0, -3.0]]))


# --- reinforce++ ---------------------------------------------------------------------------------


def test_reinforce_plus_plus_returns_carry_across_env_tokens():
    # gamma = .5
    # row0 mask [1, 1, 0, 1, 0] (env token at t2, padding at t4), reward 1 placed at t3 (last masked):
    #   t3: 1; t2 (env): carries 1, output 0; t1: 0 + .5*1 = .5; t0: .25  -> [.25, .5, 0, 1, 0]
    #   (cutting credit at the env token would give t1 = 0; counting it as a step, t1 = .25)
    # row1 mask [0, 1, 1, 1, 1], reward -1 at t4:
    #   t4: -1; t3: -.5; t2: -.25; t1: -.125; t0 unmasked -> 0  -> [0, -.125, -.25, -.5, -1]
    batch = _batch([1.0, -1.0], mask=[[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]])
    adv, ret = _run("reinforce_plus_plus", batch, gamma=0.5)
    expected_returns = torch.tensor([[0.25, 0.5, 0.0, 1.0, 0.0], [0.0, -0.125, -0.25, -0.5, -1.0]])
    torch.testing.assert_close(ret, expected_returns)

    # Whitening over the 7 masked returns [.25, .5, 1, -.125, -.25, -.5, -1]:
    #   sum = 1.75 - 1.875 = -.125 -> mean = -.125/7
    #   sum of squares = .0625 + .25 + 1 + .015625 + .0625 + .25 + 1 = 2.640625
    #   pop var = 2.640625/7 - (.125/7)^2
    mean = -0.125 / 7
    std = math.sqrt(2.640625 / 7 - (0.125 / 7) ** 2)
    mask = batch["loss_mask"]
    expected_adv = (expected_returns - mean) / (std + EPS) * mask
    torch.testing.assert_close(adv, expected_adv)
    assert adv.dtype == torch.float32
    assert (adv[mask == 0] == 0).all()
    # whitened: mean 0, pop std ~1 over masked tokens
    assert adv[mask == 1].mean().item() == pytest.approx(0.0, abs=1e-6)


def test_reinforce_plus_plus_uses_token_rewards():
    # gamma 1, all masked, token rewards [0, 1, 0, 2] -> returns = reverse cumsum = [3, 3, 2, 2]
    # row1 token rewards all 0 -> returns [0, 0, 0, 0]
    # 8 returns: mean = 10/8 = 1.25; sum sq = 9+9+4+4 = 26 -> pop var 26/8 - 1.5625 = 1.6875
    token_rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    batch = _batch([99.0, 99.0], t=4, token_rewards=token_rewards)
    adv, ret = _run("reinforce_plus_plus", batch, gamma=1.0)
    torch.testing.assert_close(ret, torch.tensor([[3.0, 3.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))
    std = math.sqrt(1.6875)
    torch.testing.assert_close(adv[0, 0], torch.tensor((3.0 - 1.25) / (std + EPS)))
    torch.testing.assert_close(adv[1, 3], torch.tensor((0.0 - 1.25) / (std + EPS)))


def test_reinforce_plus_plus_constant_returns_give_zero():
    # all returns .1 (float64): the mean .10000000000000002 must not leak through 1/(0 + eps)
    batch = Batch(
        tensors={"rewards": torch.full((3,), 0.1, dtype=torch.float64), "loss_mask": torch.ones(3, 1)}
    )
    adv, _ = _run("reinforce_plus_plus", batch)
    assert adv.abs().max().item() == 0.0


# --- remax ---------------------------------------------------------------------------------------


def test_remax_subtracts_greedy_baseline():
    # A = r - b = [1 - .25, 0 - .5] = [.75, -.5]
    batch = _batch([1.0, 0.0], mask=[[1, 1, 0], [0, 1, 1]], baseline_rewards=torch.tensor([0.25, 0.5]))
    adv, ret = _run("remax", batch)
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.0], [0.0, -0.5, -0.5]]))
    assert torch.equal(ret, adv)


def test_remax_missing_baseline_rewards():
    with pytest.raises(BatchContractError, match="remax.*baseline_rewards"):
        _run("remax", _batch([1.0, 0.0]))


def test_estimator_attributes():
    assert ADVANTAGE_ESTIMATORS.get("remax").required_keys == ("baseline_rewards",)
    assert ADVANTAGE_ESTIMATORS.get("remax").needs_greedy_baseline is True
    for name in ("grpo", "rloo", "reinforce_plus_plus"):
        fn = ADVANTAGE_ESTIMATORS.get(name)
        assert fn.needs_greedy_baseline is False
        assert fn.required_keys == ()
    assert ADVANTAGE_ESTIMATORS.get("grpo").required_meta == ("group_id",)


def test_unknown_estimator():
    with pytest.raises(ConfigError, match="grpo"):
        ADVANTAGE_ESTIMATORS.get("grpoo")


def test_missing_loss_mask():
    batch = Batch(tensors={"rewards": torch.tensor([1.0])}, meta={"group_id": [0]})
    with pytest.raises(BatchContractError, match="rloo.*loss_mask"):
        _run("rloo", batch)


# --- helpers -------------------------------------------------------------------------------------


def test_sequence_rewards_and_last_token_placement():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    placed = rewards_at_last_token(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    # last masked columns: 1, 3, none, 2
    expected = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 2], [0, 0, 0, 0], [0, 0, 4, 0]], dtype=torch.float32)
    torch.testing.assert_close(placed, expected)
    batch = Batch(tensors={"rewards": torch.zeros(4), "loss_mask": mask, "token_rewards": expected})
    assert sequence_rewards(batch).tolist() == [1.0, 2.0, 0.0, 4.0]
    del batch.tensors["token_rewards"]
    assert sequence_rewards(batch).tolist() == [0.0, 0.0, 0.0, 0.0]


# --- gae -----------------------------------------------------------------------------------------


def _gae_reference(token_rewards, values, mask, gamma, lam):
    """GAE written from the paper, one row at a time over the row's trained positions (a list)."""
    out_adv, out_ret = [], []
    for r_row, v_row, m_row in zip(token_rewards, values, mask):
        steps = [t for t, m in enumerate(m_row) if m]
        adv = [0.0] * len(m_row)
        ret = [0.0] * len(m_row)
        running = 0.0
        for i in reversed(range(len(steps))):
            t = steps[i]
            v_next = v_row[steps[i + 1]] if i + 1 < len(steps) else 0.0
            delta = r_row[t] + gamma * v_next - v_row[t]
            running = delta + gamma * lam * running
            adv[t], ret[t] = running, running + v_row[t]
        out_adv.append(adv)
        out_ret.append(ret)
    return out_adv, out_ret


def test_gae_by_hand_with_an_environment_gap():
    # Row 0: trained columns 1..3, reward 1 at column 3; gamma 0.9, lambda 0.8 (gamma*lambda = 0.72):
    #   t3: delta = 1 - 0.7 = 0.3                A3 = 0.3
    #   t2: delta = 0.9*0.7 - 0.6 = 0.03          A2 = 0.03 + 0.72*0.3 = 0.246
    #   t1: delta = 0.9*0.6 - 0.5 = 0.04          A1 = 0.04 + 0.72*0.246 = 0.21712
    # Row 1: column 2 is an environment token (mask 0, its value ignored); same reward:
    #   t3: A3 = 0.3;  t1: delta = 0.9*0.7 - 0.5 = 0.13, A1 = 0.13 + 0.72*0.3 = 0.346
    values = torch.tensor([[0.0, 0.5, 0.6, 0.7], [0.0, 0.5, 9.0, 0.7]])
    batch = _batch([1.0, 1.0], mask=[[0, 1, 1, 1], [0, 1, 0, 1]], values=values)
    adv, ret = _run("gae", batch, gamma=0.9, gae_lambda=0.8, whiten_advantages=False)
    torch.testing.assert_close(adv, torch.tensor([[0, 0.21712, 0.246, 0.3], [0, 0.346, 0, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0, 0.71712, 0.846, 1.0], [0, 0.846, 0, 1.0]]))


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_the_per_row_reference_and_whitens(gamma, lam):
    g = torch.Generator().manual_seed(int(gamma * 100 + lam * 10))
    mask = (torch.rand(5, 9, generator=g) > 0.3).float()
    mask[:, 0] = 0
    mask[4] = 0  # a row without trained tokens
    values = torch.randn(5, 9, generator=g)
    token_rewards = torch.randn(5, 9, generator=g) * mask
    batch = _batch([0.0] * 5, mask=mask.tolist(), values=values, token_rewards=token_rewards)
    adv, ret = _run("gae", batch, gamma=gamma, gae_lambda=lam, whiten_advantages=False)
    ref_adv, ref_ret = _gae_reference(token_rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(ref_adv), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, torch.tensor(ref_ret), atol=1e-5, rtol=1e-5)
    if lam == 1.0 and gamma == 1.0:  # Monte-Carlo: A_t = (sum of rewards from t) - V_t
        suffix = torch.flip(torch.cumsum(torch.flip(token_rewards, [1]), 1), [1])
        torch.testing.assert_close(adv, (suffix - values) * mask, atol=1e-5, rtol=1e-5)
    white, ret2 = _run("gae", batch, gamma=gamma, gae_lambda=lam)
    torch.testing.assert_close(ret2, ret)  # the critic's target is not whitened
    picked = white[mask > 0]
    assert picked.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert picked.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    assert torch.equal(white[mask == 0], torch.zeros_like(white[mask == 0]))


def test_gae_needs_values_of_the_mask_shape():
    assert ADVANTAGE_ESTIMATORS.get("gae").required_keys == ("values",)
    with pytest.raises(BatchContractError, match="gae.*values"):
        _run("gae", _batch([1.0], mask=[[1, 1]]))
    with pytest.raises(BatchContractError, match="'values' must be \\[1, 2\\]"):
        _run("gae", _batch([1.0], mask=[[1, 1]], values=torch.zeros(1, 3)))
