"""kl_to_ref/<role>: each role's drift from the reference, against hand-computed k1 / k3 values."""

import math

import pytest
import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.trainer.step_metrics import role_kl_metrics


def _batch(**extra) -> Batch:
    # two proposer rows, one solver row; column 0 is never trained
    tensors = {
        F.LOSS_MASK: torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1]]),
        F.REF_LOGPROBS: torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, -9.0], [0.0, -0.5, -0.5]]),
        **extra,
    }
    return Batch(tensors, {F.ROLE: ["proposer", "proposer", "solver"]})


def test_k1_and_k3_per_role_by_hand():
    lp = torch.tensor([[0.0, -0.5, -2.0], [0.0, -2.0, 0.0], [0.0, -0.5, -1.5]])
    batch = _batch(**{F.OLD_LOGPROBS: lp})
    # k1 = lp - ref on the trained tokens: proposer (0.5, 0.0, -1.0), solver (0.0, -1.0)
    expected = {"kl_to_ref/proposer": -0.5 / 3, "kl_to_ref/solver": -0.5}
    assert role_kl_metrics(batch, "k1") == pytest.approx(expected, rel=1e-6)
    # k3 = exp(ref - lp) - (ref - lp) - 1
    k3 = [math.exp(d) - d - 1 for d in (-0.5, 0.0, 1.0)]
    got = role_kl_metrics(batch, "k3")
    assert math.isclose(got["kl_to_ref/proposer"], sum(k3) / 3, rel_tol=1e-6)
    assert math.isclose(got["kl_to_ref/solver"], (0.0 + math.exp(1.0) - 2.0) / 2, rel_tol=1e-6)


def test_sampling_policy_falls_back_to_the_engines_logprobs():
    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, 0.0], [0.0, -1.5, -0.5]])
    got = role_kl_metrics(_batch(**{F.ROLLOUT_LOGPROBS: lp}), "k1")
    assert got == {"kl_to_ref/proposer": 0.0, "kl_to_ref/solver": -0.5}


def test_nothing_without_roles_or_reference():
    lp = torch.zeros(3, 3)
    assert role_kl_metrics(Batch({F.LOSS_MASK: torch.ones(3, 3), F.OLD_LOGPROBS: lp}, {}), "k3") == {}
    no_ref = Batch({F.LOSS_MASK: torch.ones(3, 3), F.OLD_LOGPROBS: lp}, {F.ROLE: ["a", "b", "c"]})
    assert role_kl_metrics(no_ref, "k3") == {}
