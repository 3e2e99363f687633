"""KL estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_azr.algorithms.kl import KL_ESTIMATORS, kl_penalty
from nemo_azr.errors import ConfigError

# d = logp - ref = [.5, -1, 0]
LOGP = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)


def test_k1():
    torch.testing.assert_close(
        kl_penalty(LOGP, REF, "k1"), torch.tensor([[0.5, -1.0, 0.0]], dtype=torch.float64)
    )


def test_k2():
    # .5 * d^2 = [.5 * .25, .5 * 1, 0] = [.125, .5, 0]
    torch.testing.assert_close(
        kl_penalty(LOGP, REF, "k2"), torch.tensor([[0.125, 0.5, 0.0]], dtype=torch.float64)
    )


def test_k3():
    # x = ref - logp = [-.5, 1, 0]; exp(x) - x - 1:
    #   exp(-.5) + .5 - 1 = .60653066 - .5 = .10653066
    #   exp(1) - 1 - 1    = 2.71828183 - 2 = .71828183
    #   exp(0) - 0 - 1    = 0
    expected = torch.tensor([[0.10653066, 0.71828183, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k3"), expected, rtol=0, atol=1e-8)


def test_k3_clamps_log_ratio_both_sides():
    # ref - logp = +50 -> clamped to 20: exp(20) - 20 - 1 = 485165195.4097903 - 21 = 485165174.4097903
    # ref - logp = -50 -> clamped to -20: exp(-20) + 20 - 1 = 19.0000000020612 (unclamped would be 49)
    logp = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[50.0, -50.0]], dtype=torch.float64)
    out = kl_penalty(logp, ref, "k3")
    assert out[0, 0].item() == pytest.approx(485165174.4097903, rel=1e-12)
    assert out[0, 1].item() == pytest.approx(19.0000000020612, rel=1e-12)
    # float32 stays finite too
    assert torch.isfinite(kl_penalty(logp.float(), ref.float() * 100, "k3")).all()


def test_k3_gradient():
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = -exp(ref - logp) + 1; at x = ref - logp = 1: 1 - e
    logp = torch.tensor([[-2.0]], dtype=torch.float64, requires_grad=True)
    kl_penalty(logp, torch.tensor([[-1.0]], dtype=torch.float64), "k3").sum().backward()
    assert logp.grad.item() == pytest.approx(1.0 - math.e)


def test_unknown_estimator_lists_known():
    with pytest.raises(ConfigError) as info:
        kl_penalty(LOGP, REF, "k4")
    for name in KL_ESTIMATORS:
        assert name in str(info.value)
    assert KL_ESTIMATORS == ("k1", "k2", "k3")
