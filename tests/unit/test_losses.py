"""Policy losses and the actor objective against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

import nemo_azr.algorithms  # noqa: F401  (registers the losses)
from nemo_azr.algorithms.aggregation import aggregate_loss
from nemo_azr.algorithms.objective import apply_kl_reward_penalty, policy_objective
from nemo_azr.config.schema import AlgorithmConfig, KLConfig
from nemo_azr.contracts.batch import Batch
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.registry import POLICY_LOSSES

D = torch.float64

# --- ppo_clip ------------------------------------------------------------------------------------
# clip low .2, high .3 (asymmetric so each side is checked), dual-clip c = 3, old logprobs 0.
#   t  A   ratio  pg1=-A r  pg2=-A clip(r,.8,1.3)  max    dual: A<0 -> min(max, -A c = 3)   grad=-A r if used
#   0  +1  1.5    -1.5      -1.3                   -1.3   -                                   0    (clip high)
#   1  +1  0.5    -0.5      -0.8                   -0.5   -                                   -.5
#   2  -1  0.5     0.5       0.8                    0.8   0.8                                 0    (clip low)
#   3  -1  1.2     1.2       1.2                    1.2   1.2                                 1.2
#   4  -1  5.0     5.0       1.3                    5.0   3.0 (dual clip active)              0
#   5  +2  1.0    -2.0      -2.0                   -2.0   -                                   -2
#   6  +1  10     (masked out: ignored by the metrics)
PPO_A = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 2.0, 1.0]], dtype=D)
PPO_RATIO = [1.5, 0.5, 0.5, 1.2, 5.0, 1.0, 10.0]
PPO_MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0]], dtype=D)


def _ppo_cfg(**kw) -> AlgorithmConfig:
    base = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.3, "dual_clip": True, "clip_ratio_c": 3.0}
    return AlgorithmConfig(**{**base, **kw})


def _ppo_inputs():
    logprobs = torch.tensor([[math.log(r) for r in PPO_RATIO]], dtype=D, requires_grad=True)
    return logprobs, torch.zeros(1, 7, dtype=D)


def test_ppo_clip_values_gradient_and_metrics():
    logprobs, old = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(
        logprobs=logprobs, old_logprobs=old, advantages=PPO_A, loss_mask=PPO_MASK, cfg=_ppo_cfg()
    )
    torch.testing.assert_close(loss[:, :6], torch.tensor([[-1.3, -0.5, 0.8, 1.2, 3.0, -2.0]], dtype=D))
    (loss * PPO_MASK).sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.5, 0.0, 1.2, 0.0, -2.0, 0.0]], dtype=D))
    # pg2 > pg1 at t0 and t2 -> 2/6; dual clip at t4 -> 1/6
    assert metrics["clip_frac"].item() == pytest.approx(2 / 6)
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 6)
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 0.5 + 1.2 + 5.0 + 1.0) / 6)
    # approx_kl = mean of k3(old || new) = r - log r - 1 over the 6 masked tokens
    k3 = [r - math.log(r) - 1 for r in PPO_RATIO[:6]]  # [.0945, .1931, .1931, .0177, 2.3906, 0]
    assert metrics["approx_kl"].item() == pytest.approx(sum(k3) / 6)
    assert all(not v.requires_grad for v in metrics.values())


def test_ppo_clip_without_dual_clip():
    # t4 is then the plain PPO value max(5, 1.3) = 5, with gradient -A r = 5
    logprobs, old = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=PPO_A,
        loss_mask=PPO_MASK,
        cfg=_ppo_cfg(dual_clip=False),
    )
    assert loss[0, 4].item() == pytest.approx(5.0)
    loss[0, 4].backward()
    assert logprobs.grad[0, 4].item() == pytest.approx(5.0)
    assert metrics["dual_clip_frac"].item() == 0.0


def test_ppo_dual_clip_needs_c_above_one():
    logprobs, old = _ppo_inputs()
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        POLICY_LOSSES.get("ppo_clip")(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=PPO_A,
            loss_mask=PPO_MASK,
            cfg=_ppo_cfg(clip_ratio_c=1.0),
        )


def test_ppo_extreme_log_ratio_is_finite():
    # log-ratio 100 is clamped to 20: ratio exp(20), A = -1, no dual clip -> loss exp(20)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(
        logprobs=torch.tensor([[100.0]], dtype=D),
        old_logprobs=torch.zeros(1, 1, dtype=D),
        advantages=torch.tensor([[-1.0]], dtype=D),
        loss_mask=torch.ones(1, 1),
        cfg=_ppo_cfg(dual_clip=False),
    )
    assert loss.item() == pytest.approx(math.exp(20.0))


# --- gspo ----------------------------------------------------------------------------------------
# old = 0; clip .2 / .3
#   row0 A=+1, mask [1,1,0], logp [.2, 0, 9]  -> s = exp((.2+0)/2)      = exp(.1) = 1.10517 (unclipped)
#   row1 A=-1, mask [1,1,1], logp [.3,-.3,.9] -> s = exp(.9/3)          = exp(.3) = 1.34986
#         pg1 = 1.34986 > pg2 = 1.3 -> unclipped (no dual clip in gspo)
#   row2 A=+1, mask [1,1,1], logp [.9,.3,-.3] -> s = exp(.3); pg1 = -1.34986 < pg2 = -1.3 -> clipped
#   (per-token PPO ratios would be e.g. exp(.9) = 2.46 / exp(-.3) = .74: different values)
GSPO_LOGP = [[0.2, 0.0, 9.0], [0.3, -0.3, 0.9], [0.9, 0.3, -0.3]]
GSPO_A = torch.tensor([[1.0] * 3, [-1.0] * 3, [1.0] * 3], dtype=D)
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=D)
GSPO_CFG = AlgorithmConfig(loss="gspo", clip_ratio_low=0.2, clip_ratio_high=0.3)


def _gspo(logprobs):
    return POLICY_LOSSES.get("gspo")(
        logprobs=logprobs,
        old_logprobs=torch.zeros(3, 3, dtype=D),
        advantages=GSPO_A,
        loss_mask=GSPO_MASK,
        cfg=GSPO_CFG,
    )


def test_gspo_sequence_ratio_values_and_metrics():
    loss, metrics = _gspo(torch.tensor(GSPO_LOGP, dtype=D))
    e1, e3 = math.exp(0.1), math.exp(0.3)
    torch.testing.assert_close(loss[0, :2], torch.tensor([-e1, -e1], dtype=D))
    torch.testing.assert_close(loss[1], torch.tensor([e3, e3, e3], dtype=D))
    torch.testing.assert_close(loss[2], torch.tensor([-1.3, -1.3, -1.3], dtype=D))
    # clipped (pg2 > pg1) only on row2's 3 tokens, out of 8 masked tokens
    assert metrics["clip_frac"].item() == pytest.approx(3 / 8)
    assert metrics["ratio_mean"].item() == pytest.approx((2 * e1 + 6 * e3) / 8)


def test_gspo_gradient_matches_sequence_objective():
    # Token form + seq-mean-token-mean must give the gradient of the sequence-level objective
    #   J = 1/B sum_i max(-A_i s_i, -A_i clip(s_i)),  s_i = exp(mean_t m (logp - old))  (full autograd)
    # By hand: dJ/dlogp_{i,t} = -A_i s_i / |y_i| / B when unclipped, else 0:
    #   row0: -exp(.1)/2/3 on its two masked tokens; row1: +exp(.3)/3/3; row2 (clipped): 0.
    token_lp = torch.tensor(GSPO_LOGP, dtype=D, requires_grad=True)
    loss_mat, _ = _gspo(token_lp)
    aggregate_loss(loss_mat, GSPO_MASK, "seq-mean-token-mean").backward()

    seq_lp = torch.tensor(GSPO_LOGP, dtype=D, requires_grad=True)
    s = torch.exp((seq_lp * GSPO_MASK).sum(-1) / GSPO_MASK.sum(-1))
    a = GSPO_A[:, 0]
    objective = torch.maximum(-a * s, -a * s.clamp(0.8, 1.3)).mean()
    objective.backward()

    torch.testing.assert_close(token_lp.grad, seq_lp.grad)
    e1, e3 = math.exp(0.1), math.exp(0.3)
    by_hand = torch.tensor([[-e1 / 6, -e1 / 6, 0.0], [e3 / 9] * 3, [0.0] * 3], dtype=D)
    torch.testing.assert_close(token_lp.grad, by_hand)
    assert objective.item() == pytest.approx((-e1 + e3 - 1.3) / 3)


# --- cispo ---------------------------------------------------------------------------------------
# Same tokens as ppo_clip (clip low .2, high .3 -> weight in [0.8, 1.3], detached):
#   t  A   ratio  w=clip(r)  loss=-A w logp        dloss/dlogp = -A w
#   0  +1  1.5    1.3        -1.3 log 1.5           -1.3   (clipped: gradient kept, weight capped)
#   1  +1  0.5    0.8        -0.8 log 0.5           -0.8   (clipped low)
#   2  -1  0.5    0.8         0.8 log 0.5            0.8   (clipped low)
#   3  -1  1.2    1.2         1.2 log 1.2            1.2
#   4  -1  5.0    1.3         1.3 log 5              1.3   (clipped high)
#   5  +2  1.0    1.0        -2   log 1 = 0         -2.0


def test_cispo_values_gradient_and_metrics():
    logprobs, old = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("cispo")(
        logprobs=logprobs, old_logprobs=old, advantages=PPO_A, loss_mask=PPO_MASK, cfg=_ppo_cfg()
    )
    weights = [1.3, 0.8, 0.8, 1.2, 1.3, 1.0]
    expected = [-a * w * math.log(r) for a, w, r in zip(PPO_A[0, :6].tolist(), weights, PPO_RATIO)]
    torch.testing.assert_close(loss[0, :6], torch.tensor(expected, dtype=D))
    (loss * PPO_MASK).sum().backward()
    grad = [-a * w for a, w in zip(PPO_A[0, :6].tolist(), weights)] + [0.0]
    torch.testing.assert_close(logprobs.grad, torch.tensor([grad], dtype=D))  # no token loses its gradient
    assert metrics["clip_frac"].item() == pytest.approx(4 / 6)  # t0, t1, t2, t4
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 0.5 + 1.2 + 5.0 + 1.0) / 6)


def test_cispo_without_lower_bound_and_on_policy_equals_reinforce():
    """clip_ratio_low >= 1: no lower bound (the paper's setting); at ratio 1 the gradient is -A."""
    logprobs, old = _ppo_inputs()
    loss, metrics = POLICY_LOSSES.get("cispo")(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=PPO_A,
        loss_mask=PPO_MASK,
        cfg=_ppo_cfg(clip_ratio_low=1.0),
    )
    (loss * PPO_MASK).sum().backward()
    weights = [1.3, 0.5, 0.5, 1.2, 1.3, 1.0]  # 0.5 is kept: only the upper bound clips
    torch.testing.assert_close(
        logprobs.grad,
        torch.tensor([[-a * w for a, w in zip(PPO_A[0, :6].tolist(), weights)] + [0.0]], dtype=D),
    )
    assert metrics["clip_frac"].item() == pytest.approx(2 / 6)
    lp = torch.tensor([[-0.7, -1.2]], dtype=D, requires_grad=True)
    adv = torch.tensor([[0.5, -2.0]], dtype=D)
    out, _ = POLICY_LOSSES.get("cispo")(
        logprobs=lp,
        old_logprobs=lp.detach(),
        advantages=adv,
        loss_mask=torch.ones(1, 2, dtype=D),
        cfg=_ppo_cfg(),
    )
    out.sum().backward()
    torch.testing.assert_close(lp.grad, -adv)  # REINFORCE's -A * dlogp


def test_unknown_loss():
    with pytest.raises(ConfigError, match="ppo_clip"):
        POLICY_LOSSES.get("ppo_clipp")


# --- policy_objective ----------------------------------------------------------------------------


def _objective_inputs():
    # ratio 1 everywhere (logp = old = 0), A = 1 on 2 masked tokens -> pg = token-mean(-1) = -1
    logprobs = torch.zeros(1, 3, dtype=D, requires_grad=True)
    return {
        "logprobs": logprobs,
        "old_logprobs": torch.zeros(1, 3, dtype=D),
        "advantages": torch.tensor([[1.0, 1.0, 0.0]], dtype=D),
        "loss_mask": torch.tensor([[1, 1, 0]], dtype=D),
        "ref_logprobs": torch.tensor([[-0.5, 0.5, 7.0]], dtype=D),
        "entropy": torch.tensor([[2.0, 4.0, 100.0]], dtype=D),
    }


def test_policy_objective_pg_kl_entropy():
    # kl k2 = .5 * (0 - ref)^2 = [.125, .125] -> mean .125; coef .1 -> +.0125
    # entropy mean (2 + 4)/2 = 3; coef .01 -> -.03
    # total = -1 + .0125 - .03 = -1.0175
    cfg = AlgorithmConfig(kl=KLConfig(coef=0.1, estimator="k2", mode="loss"), entropy_coef=0.01)
    loss, metrics = policy_objective(**_objective_inputs(), cfg=cfg)
    assert loss.item() == pytest.approx(-1.0175)
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0)
    assert metrics["actor/kl_loss"] == pytest.approx(0.125)
    assert metrics["actor/entropy"] == pytest.approx(3.0)
    assert metrics["actor/clip_frac"] == 0.0
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in metrics.values())


def test_policy_objective_kl_in_reward_mode_is_not_in_loss():
    cfg = AlgorithmConfig(kl=KLConfig(coef=0.1, estimator="k2", mode="reward"))
    loss, metrics = policy_objective(**_objective_inputs(), cfg=cfg)
    assert loss.item() == pytest.approx(-1.0)
    assert "actor/kl_loss" not in metrics


def test_policy_objective_needs_ref_logprobs():
    inputs = _objective_inputs()
    inputs["ref_logprobs"] = None
    with pytest.raises(BatchContractError, match="ref_logprobs"):
        policy_objective(**inputs, cfg=AlgorithmConfig(kl=KLConfig(coef=0.1)))


def test_policy_objective_sum_norm_uses_cfg_norm_length():
    # seq-mean-token-sum-norm: sum(-1 * 2 tokens) / (1 seq * norm_length 4) = -.5
    cfg = AlgorithmConfig(loss_agg_mode="seq-mean-token-sum-norm", norm_length=4)
    loss, _ = policy_objective(**_objective_inputs(), cfg=cfg)
    assert loss.item() == pytest.approx(-0.5)
    # an explicit norm_length wins: -2 / 8
    loss, _ = policy_objective(**_objective_inputs(), cfg=cfg, norm_length=8)
    assert loss.item() == pytest.approx(-0.25)


# --- apply_kl_reward_penalty ---------------------------------------------------------------------


def _kl_reward_batch(**extra: torch.Tensor) -> Batch:
    return Batch(
        tensors={
            "rewards": torch.tensor([1.0, 2.0]),
            "loss_mask": torch.tensor([[1, 1, 0], [0, 1, 1]]),
            "old_logprobs": torch.zeros(2, 3),
            "ref_logprobs": torch.tensor([[-1.0, 0.0, 5.0], [5.0, -1.0, 0.0]]),
            **extra,
        }
    )


def test_apply_kl_reward_penalty():
    # k1 = old - ref; old = 0:
    #   row0 ref [-1, 0, 5] -> kl [1, 0, -5] * mask [1, 1, 0] = [1, 0, 0]
    #   row1 ref [5, -1, 0] -> kl [-5, 1, 0] * mask [0, 1, 1] = [0, 1, 0]
    # rewards [1, 2] at the last masked token: row0 t1, row1 t2; coef .5:
    #   row0 [0, 1, 0] - .5 [1, 0, 0] = [-.5, 1, 0]
    #   row1 [0, 0, 2] - .5 [0, 1, 0] = [0, -.5, 2]
    # penalty mean over the 4 masked tokens: .5 * (1 + 0 + 1 + 0) / 4 = .25
    batch = _kl_reward_batch()
    cfg = AlgorithmConfig(kl=KLConfig(coef=0.5, estimator="k1", mode="reward"))
    metrics = apply_kl_reward_penalty(batch, cfg)
    torch.testing.assert_close(batch["token_rewards"], torch.tensor([[-0.5, 1.0, 0.0], [0.0, -0.5, 2.0]]))
    assert metrics["kl/reward_penalty_mean"] == pytest.approx(0.25)


def test_apply_kl_reward_penalty_scales_each_row_by_its_kl_weight():
    # the batch above with kl_weight [0, 3]: row0 keeps its reward, row1's penalty is 3 * .5 * 1
    batch = _kl_reward_batch(kl_weight=torch.tensor([0.0, 3.0]))
    cfg = AlgorithmConfig(kl=KLConfig(coef=0.5, estimator="k1", mode="reward"))
    apply_kl_reward_penalty(batch, cfg)
    torch.testing.assert_close(batch["token_rewards"], torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.5, 2.0]]))


def test_apply_kl_reward_penalty_is_noop_in_loss_mode():
    batch = Batch(tensors={"rewards": torch.tensor([1.0]), "loss_mask": torch.ones(1, 2)})
    assert apply_kl_reward_penalty(batch, AlgorithmConfig(kl=KLConfig(coef=0.5, mode="loss"))) == {}
    assert "token_rewards" not in batch
    with pytest.raises(ConfigError, match="kl.mode"):
        apply_kl_reward_penalty(batch, AlgorithmConfig(kl=KLConfig(coef=0.5, mode="both")))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_policy_objective_micro_batches_add_up(mode):
    # Global normalisers passed through: sum of micro-batch losses (and grads) == mini-batch loss.
    gen = torch.Generator().manual_seed(1)
    shape = (6, 4)
    lp = torch.randn(shape, generator=gen, dtype=D) * 0.3
    inputs = {
        "old_logprobs": torch.randn(shape, generator=gen, dtype=D) * 0.3,
        "advantages": torch.randn(shape, generator=gen, dtype=D),
        "loss_mask": (torch.rand(shape, generator=gen) > 0.3).to(D),
        "ref_logprobs": torch.randn(shape, generator=gen, dtype=D) * 0.3,
        "entropy": torch.rand(shape, generator=gen, dtype=D),
    }
    cfg = AlgorithmConfig(loss_agg_mode=mode, loss_eta=0.5, kl=KLConfig(coef=0.2), entropy_coef=0.05)
    whole_lp = lp.clone().requires_grad_(True)
    whole, _ = policy_objective(logprobs=whole_lp, **inputs, cfg=cfg)
    whole.backward()

    micro_lp = lp.clone().requires_grad_(True)
    n_tok, total = float(inputs["loss_mask"].sum()), 0.0
    for rows in (slice(0, 4), slice(4, 6)):
        part, _ = policy_objective(
            logprobs=micro_lp[rows],
            **{k: v[rows] for k, v in inputs.items()},
            cfg=cfg,
            num_tokens=n_tok,
            num_seqs=6,
        )
        total = total + part
    total.backward()
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(micro_lp.grad, whole_lp.grad)
