"""PPO's critic: the clipped value loss by hand, explained variance, and the hf value model."""

from __future__ import annotations

import pytest
import torch

from nemo_azr.algorithms.value_loss import clipped_value_loss, explained_variance
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.errors import BatchContractError, CheckpointError
from nemo_azr.models.hf.critic import HFCritic
from nemo_azr.preflight import load_config

D = torch.float64

# --- the value loss ------------------------------------------------------------------------------
# cliprange 0.2; per token: V_clip = old + clip(V - old, -0.2, 0.2), loss = 0.5 * max((V-R)^2, (Vc-R)^2)
#   t  V    old  R    (V-R)^2  Vc    (Vc-R)^2  max    clip active
#   0  1.0  0.5  1.0  0        0.7   0.09      0.09   yes (moved 0.5 towards R: only 0.2 counts)
#   1  0.4  0.5  1.0  0.36     0.4   0.36      0.36   no  (inside the range)
#   2  0.0  0.5  0.0  0        0.3   0.09      0.09   yes
#   3  2.0  0.0  0.0  4.0      0.2   0.04      4.0    no  (moving away: the unclipped error counts)
#   4  9.0  0.0  0.0  (masked)
VALUES = [[1.0, 0.4, 0.0, 2.0, 9.0]]
OLD = [[0.5, 0.5, 0.5, 0.0, 0.0]]
RETURNS = [[1.0, 1.0, 0.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 1, 0]]


def _loss(values, cliprange=0.2, **kw):
    return clipped_value_loss(
        values=values,
        old_values=torch.tensor(OLD, dtype=D),
        returns=torch.tensor(RETURNS, dtype=D),
        loss_mask=torch.tensor(MASK, dtype=D),
        cliprange=cliprange,
        **kw,
    )


def test_clipped_value_loss_by_hand():
    values = torch.tensor(VALUES, dtype=D, requires_grad=True)
    loss, metrics = _loss(values)
    assert loss.item() == pytest.approx(0.5 * (0.09 + 0.36 + 0.09 + 4.0) / 4)
    loss.backward()
    # d/dV: clipped tokens 0 and 2 get no gradient; 1: (V - R) / 4 = -0.15; 3: (2 - 0) / 4 = 0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.15, 0.0, 0.5, 0.0]], dtype=D))
    assert metrics["critic/vf_clipfrac"] == pytest.approx(2 / 4)
    assert metrics["critic/vpred_mean"] == pytest.approx((1.0 + 0.4 + 0.0 + 2.0) / 4)
    assert metrics["critic/vf_loss"] == pytest.approx(loss.item())
    unclipped, m = _loss(torch.tensor(VALUES, dtype=D), cliprange=0.0)
    assert (
        unclipped.item() == pytest.approx(0.5 * (0 + 0.36 + 0 + 4.0) / 4) and m["critic/vf_clipfrac"] == 0.0
    )


def test_value_clipfrac_counts_only_tokens_outside_the_clip_range_in_float32():
    """Inside the range the clipped value is the value itself (verl's clip_by_value): float32
    rounding of old + (V - old) must not make a token count as clipped."""
    g = torch.Generator().manual_seed(0)
    old, values, returns = (torch.randn(256, 64, generator=g) for _ in range(3))
    mask, c = torch.ones(256, 64), 1.0
    _, m = clipped_value_loss(values=values, old_values=old, returns=returns, loss_mask=mask, cliprange=c)

    outside = (values - old).abs() > c
    clipped = torch.where(values > old + c, old + c, torch.where(values < old - c, old - c, values))
    larger = (clipped - returns).square() > (values - returns).square()
    expected = float((larger & outside).float().mean())
    assert m["critic/vf_clipfrac"] == pytest.approx(expected) and expected > 0.05
    # The sum form counts tokens inside the range too (rounding): the data exercises what is ignored.
    summed = old + (values - old).clamp(-c, c)
    summed_count = float(((summed - returns).square() > (values - returns).square()).float().mean())
    assert summed_count > expected


def test_value_loss_micro_batches_add_up_with_global_normalisers():
    g = torch.Generator().manual_seed(0)
    v, old, ret = (torch.randn(6, 7, generator=g, dtype=D) for _ in range(3))
    mask = (torch.rand(6, 7, generator=g) > 0.3).to(D)
    for mode in ("token-mean", "seq-mean-token-mean"):
        kw = {"cliprange": 0.3, "loss_agg_mode": mode, "num_tokens": float(mask.sum()), "num_seqs": 6}
        whole, _ = clipped_value_loss(values=v, old_values=old, returns=ret, loss_mask=mask, **kw)
        parts = sum(
            clipped_value_loss(
                values=v[i : i + 2],
                old_values=old[i : i + 2],
                returns=ret[i : i + 2],
                loss_mask=mask[i : i + 2],
                **kw,
            )[0]
            for i in (0, 2, 4)
        )
        assert parts.item() == pytest.approx(whole.item())


def test_value_loss_shape_mismatch_is_a_contract_error():
    with pytest.raises(BatchContractError, match="returns is \\[1, 3\\]"):
        clipped_value_loss(
            values=torch.zeros(1, 2),
            old_values=torch.zeros(1, 2),
            returns=torch.zeros(1, 3),
            loss_mask=torch.ones(1, 2),
            cliprange=0.2,
        )


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)  # perfect critic
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)  # the mean
    # residuals [1, 1, 1, 1] - a constant offset: Var(R - V) = 0 -> 1 (a baseline shift is free)
    assert explained_variance(returns - 1, returns, mask) == pytest.approx(1.0)
    # V = [2, 1, 4, 3]: residuals [-1, 1, -1, 1], Var 1; Var(R) = 1.25 -> 1 - 1 / 1.25 = 0.2
    v = torch.tensor([[2.0, 1.0, 4.0, 3.0, 0.0]])
    assert explained_variance(v, returns, mask) == pytest.approx(0.2)


# --- the hf value model -----------------------------------------------------------------------------


@pytest.fixture
def cfg(tiny_cache, tmp_path):
    return load_config(
        [f"model.tiny.cache_dir={tiny_cache}", "algorithm=ppo", f"trainer.output_dir={tmp_path}"]
    )


def _batch(rows: int = 3, width: int = 9, roles=None, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (rows, width), generator=g)
    attn = torch.ones(rows, width, dtype=torch.long)
    attn[0, :2] = 0  # a left-padded prompt
    mask = torch.zeros(rows, width)
    mask[:, 5:] = 1
    mask[1, 8] = 0  # a shorter response
    meta = {F.UID: [f"u{i}" for i in range(rows)], F.GROUP_ID: [0] * rows}
    if roles is not None:
        meta[F.ROLE] = list(roles)
    return Batch({F.INPUT_IDS: ids, F.ATTENTION_MASK: attn, F.LOSS_MASK: mask}, meta)


def test_values_start_at_zero_and_are_causal(cfg, tiny_model_path):
    critic = HFCritic(tiny_model_path, cfg)
    batch = _batch()
    assert torch.equal(critic.compute_values(batch), torch.zeros(3, 9))  # zero-initialised head
    with torch.no_grad():
        critic.model.score.weight.normal_(0, 1.0)
    values = critic.compute_values(batch)
    assert torch.equal(values[batch[F.LOSS_MASK] == 0], torch.zeros_like(values[batch[F.LOSS_MASK] == 0]))
    assert (values[batch[F.LOSS_MASK] > 0] != 0).all()
    # values[:, t] is V of the state before token t: changing token 6 moves the values from column 7 on
    changed = _batch()
    changed[F.INPUT_IDS][:, 6] = 3
    after = critic.compute_values(changed)
    torch.testing.assert_close(after[:, :7], values[:, :7])
    assert not torch.allclose(after[:, 7:8], values[:, 7:8])


def test_each_role_reads_its_own_value_head(cfg, tiny_model_path):
    critic = HFCritic(tiny_model_path, cfg, roles=("solver", "proposer"))
    assert critic.model.score.out_features == 2
    with torch.no_grad():
        critic.model.score.weight.normal_(0, 1.0)
        critic.model.score.weight[1] = critic.model.score.weight[0]  # the heads differ by their bias only
        critic.model.score.bias.copy_(torch.tensor([0.0, 10.0]))
    batch = _batch(roles=["solver", "proposer", "solver"])
    values = critic.compute_values(batch)
    as_solver = critic.compute_values(_batch(roles=["solver"] * 3))
    torch.testing.assert_close(values[[0, 2]], as_solver[[0, 2]])
    mask = batch[F.LOSS_MASK][1] > 0
    torch.testing.assert_close(values[1][mask] - as_solver[1][mask], torch.full((int(mask.sum()),), 10.0))
    with pytest.raises(BatchContractError, match="role\\(s\\) \\['judge'\\] have no value head"):
        critic.compute_values(_batch(roles=["judge", "solver", "solver"]))


def test_critic_update_fits_the_returns_and_round_trips(cfg, tiny_model_path, tmp_path):
    cfg.critic.optim.lr = 3e-3
    cfg.critic.cliprange_value = 0.0
    critic = HFCritic(tiny_model_path, cfg)
    critic.setup_optimizer(total_steps=40)
    batch = _batch(rows=4, seed=1)
    mask = batch[F.LOSS_MASK]
    batch[F.RETURNS] = torch.tensor([1.0, -1.0, 0.5, 0.0]).view(-1, 1) * mask
    losses = []
    for _ in range(30):
        batch[F.VALUES] = critic.compute_values(batch)
        metrics = critic.update(batch, UpdateContext(norm_length=4))
        losses.append(metrics["critic/vf_loss"])
        assert metrics["critic/optimizer_steps"] == 1.0 and "critic/grad_norm" in metrics
    assert losses[-1] < 0.1 * losses[0]
    assert metrics["critic/explained_variance"] > 0.8
    critic.save(tmp_path)
    again = HFCritic(tiny_model_path, cfg)
    again.setup_optimizer(total_steps=40)
    again.load(tmp_path)
    torch.testing.assert_close(again.compute_values(batch), critic.compute_values(batch))
    assert again.optimizer.state_dict()["state"].keys() == critic.optimizer.state_dict()["state"].keys()
    with pytest.raises(CheckpointError, match="no critic"):
        again.load(tmp_path / "missing")
