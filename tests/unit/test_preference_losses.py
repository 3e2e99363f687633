"""DPO, IPO and KTO losses and their gradients against the papers' formulas, written out here per
pair / example with Python floats (``math``), independently of the module's tensor code."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_azr.algorithms.preference import chosen_nll, dpo_loss, ipo_loss, kto_loss, sequence_logps
from nemo_azr.errors import ConfigError
from nemo_azr.registry import PREFERENCE_LOSSES

# three pairs: policy / reference sequence log-probs of the chosen and the rejected response
C = [-1.0, -4.0, -2.5]
R = [-3.0, -2.0, -2.5]
RC = [-2.0, -3.5, -2.0]
RR = [-2.5, -2.5, -3.0]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _leaves(*values: list[float]) -> list[torch.Tensor]:
    return [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]


def test_sequence_logps_sum_the_response_tokens():
    token = torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -0.75, -9.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert sequence_logps(token, mask).tolist() == [-3.0, -1.0]


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_dpo_loss_and_gradient_equal_the_paper(eps):
    beta = 0.1
    c, r, rc, rr = _leaves(C, R, RC, RR)
    loss, metrics = dpo_loss(c, r, rc, rr, beta=beta, label_smoothing=eps)
    loss.backward()
    n = len(C)
    want, grad_c = 0.0, []
    for i in range(n):
        h = (C[i] - RC[i]) - (R[i] - RR[i])
        # -(1-eps) log sigmoid(beta h) - eps log sigmoid(-beta h), averaged over pairs
        want += (-(1 - eps) * math.log(_sigmoid(beta * h)) - eps * math.log(_sigmoid(-beta * h))) / n
        grad_c.append(beta * (-(1 - eps) * _sigmoid(-beta * h) + eps * _sigmoid(beta * h)) / n)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert c.grad.tolist() == pytest.approx(grad_c, rel=1e-10)
    assert r.grad.tolist() == pytest.approx([-g for g in grad_c], rel=1e-10)
    assert rc.grad.tolist() == pytest.approx([-g for g in grad_c], rel=1e-10)
    chosen = [beta * (C[i] - RC[i]) for i in range(n)]
    rejected = [beta * (R[i] - RR[i]) for i in range(n)]
    assert metrics["rewards_chosen"].item() == pytest.approx(sum(chosen) / n)
    assert metrics["reward_margin"].item() == pytest.approx((sum(chosen) - sum(rejected)) / n)
    # margins: pair 0: 1 - (-0.5) = 1.5 > 0; pairs 1 and 2: -0.5 - 0.5 = -1.0
    assert metrics["reward_accuracy"].item() == pytest.approx(1 / 3)


def test_ipo_loss_and_gradient_equal_the_paper():
    beta = 0.5
    c, r, rc, rr = _leaves(C, R, RC, RR)
    loss, _ = ipo_loss(c, r, rc, rr, beta=beta)
    loss.backward()
    n = len(C)
    hs = [(C[i] - RC[i]) - (R[i] - RR[i]) for i in range(n)]
    assert hs == [1.5, -1.0, -1.0]
    # (h - 1/(2 tau))^2 with tau = 0.5: target margin 1.0
    assert loss.item() == pytest.approx(((0.5) ** 2 + (-2.0) ** 2 + (-2.0) ** 2) / 3, rel=1e-12)
    assert c.grad.tolist() == pytest.approx([2 * (h - 1.0) / n for h in hs], rel=1e-12)
    assert r.grad.tolist() == pytest.approx([-2 * (h - 1.0) / n for h in hs], rel=1e-12)


def test_kto_loss_and_gradient_equal_the_paper():
    beta, lam_d, lam_u = 0.2, 1.0, 1.5
    logps_v = [-1.0, -4.0, -2.5, -3.0]
    ref_v = [-2.0, -3.5, -2.0, -2.5]
    labels = [True, True, False, False]
    kl_v, ref_kl_v = [-5.0, -6.0, -4.0], [-5.5, -6.25, -4.5]  # mean log-ratio 0.4167 -> z0
    logps, ref = _leaves(logps_v, ref_v)
    kl, ref_kl = _leaves(kl_v, ref_kl_v)
    loss, metrics = kto_loss(
        logps,
        ref,
        torch.tensor(labels),
        kl,
        ref_kl,
        beta=beta,
        desirable_weight=lam_d,
        undesirable_weight=lam_u,
    )
    loss.backward()
    z0 = max(0.0, sum(a - b for a, b in zip(kl_v, ref_kl_v)) / 3)
    n = len(logps_v)
    want, grad = 0.0, []
    for lp, rf, good in zip(logps_v, ref_v, labels):
        r = lp - rf
        if good:  # lambda_D (1 - sigmoid(beta (r - z0)))
            s = _sigmoid(beta * (r - z0))
            want += lam_d * (1 - s) / n
            grad.append(-lam_d * beta * s * (1 - s) / n)
        else:  # lambda_U (1 - sigmoid(beta (z0 - r)))
            s = _sigmoid(beta * (z0 - r))
            want += lam_u * (1 - s) / n
            grad.append(lam_u * beta * s * (1 - s) / n)
    assert metrics["kl_reference"].item() == pytest.approx(z0)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert logps.grad.tolist() == pytest.approx(grad, rel=1e-10)
    assert kl.grad is None or torch.all(kl.grad == 0)  # the reference point is not differentiated
    # ratios 1.0, -0.5, -0.5, -0.5 against z0 = 0.4167: desirable 1 right, 1 wrong; undesirable both right
    assert metrics["reward_accuracy"].item() == pytest.approx(3 / 4)


def test_kto_reference_point_is_clamped_at_zero():
    logps, ref = torch.tensor([-1.0]), torch.tensor([-1.0])
    loss, metrics = kto_loss(
        logps, ref, torch.tensor([True]), torch.tensor([-3.0]), torch.tensor([-1.0]), beta=1.0
    )
    assert metrics["kl_reference"].item() == 0.0
    assert loss.item() == pytest.approx(1 - _sigmoid(0.0))


def test_registered_by_name_and_bad_settings_are_config_errors():
    assert PREFERENCE_LOSSES.get("dpo") is dpo_loss and PREFERENCE_LOSSES.get("kto") is kto_loss
    t = torch.zeros(2)
    with pytest.raises(ConfigError, match="beta must be > 0"):
        dpo_loss(t, t, t, t, beta=0.0)
    with pytest.raises(ConfigError, match="label_smoothing must be in"):
        dpo_loss(t, t, t, t, beta=0.1, label_smoothing=0.5)
    with pytest.raises(ConfigError, match="label_smoothing is DPO's"):
        ipo_loss(t, t, t, t, beta=0.1, label_smoothing=0.1)
    with pytest.raises(ValueError, match="one value per pair"):
        dpo_loss(t, torch.zeros(3), t, t, beta=0.1)
    with pytest.raises(ConfigError, match="weights must be > 0"):
        kto_loss(t, t, torch.ones(2, dtype=torch.bool), t, t, beta=0.1, undesirable_weight=0.0)


def test_chosen_nll_is_rpos_per_token_nll_and_gradient():
    """RPO's term: mean over pairs of -log pi(y_w) / |y_w|; d/d log pi(y_w_i) = -1 / (|y_w_i| * pairs)."""
    logps = torch.tensor([-2.0, -6.0], dtype=torch.float64, requires_grad=True)
    tokens = torch.tensor([2, 3])
    value = chosen_nll(logps, tokens)
    assert float(value) == pytest.approx((2.0 / 2 + 6.0 / 3) / 2)
    value.backward()
    assert logps.grad.tolist() == pytest.approx([-1 / (2 * 2), -1 / (3 * 2)])
    with pytest.raises(ValueError, match="one value per pair"):
        chosen_nll(logps.detach(), torch.tensor([1, 2, 3]))
