"""critic.shared_trunk: the value head on the hf policy's trunk, one forward and one joint loss."""

from __future__ import annotations

import pytest
import torch

from nemo_azr.algorithms.value_loss import clipped_value_loss
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import CheckpointError
from nemo_azr.models.hf.critic import SharedTrunkCritic
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.preflight import load_config


def _batch() -> Batch:
    g = torch.Generator().manual_seed(3)
    rows, width = 3, 10
    mask = torch.zeros(rows, width)
    mask[:, 6:] = 1
    mask[2, 9] = 0
    return Batch(
        {
            F.INPUT_IDS: torch.randint(5, 60, (rows, width), generator=g),
            F.ATTENTION_MASK: torch.ones(rows, width, dtype=torch.long),
            F.LOSS_MASK: mask,
            F.ADVANTAGES: torch.randn(rows, width, generator=g) * mask,
            F.OLD_LOGPROBS: -torch.rand(rows, width, generator=g) * mask,
            F.VALUES: torch.randn(rows, width, generator=g) * mask,
            F.RETURNS: torch.randn(rows, width, generator=g) * mask,
        },
        {F.UID: ["a", "b", "c"], F.GROUP_ID: [0, 0, 1]},
    )


@pytest.mark.parametrize("fused", [True, False])
def test_joint_loss_is_policy_loss_plus_weighted_value_loss(tiny_cache, tiny_model_path, fused):
    cfg = load_config([f"model.tiny.cache_dir={tiny_cache}", "algorithm=ppo", "critic.shared_trunk=true",
                       "critic.value_loss_coef=0.25", "critic.cliprange_value=0.2"])  # fmt: skip
    batch = _batch()
    norms = {"num_tokens": float(batch[F.LOSS_MASK].sum()), "num_seqs": 3, "norm_length": 8}
    plain = HFPolicy(tiny_model_path, cfg)
    policy_loss, _ = plain.micro_objective(batch, fused=fused, **norms)

    policy = HFPolicy(tiny_model_path, cfg)
    critic = SharedTrunkCritic(policy, cfg)
    with torch.no_grad():
        policy.value_head.weight.normal_(0, 0.5)
    loss, metrics = policy.micro_objective(batch, fused=fused, **norms)
    hidden, _ = policy._hidden_states(batch)
    value_loss, _ = clipped_value_loss(
        values=policy.values_from_hidden(hidden, batch), old_values=batch[F.VALUES], returns=batch[F.RETURNS],
        loss_mask=batch[F.LOSS_MASK], cliprange=0.2, **norms,
    )  # fmt: skip
    assert loss.item() == pytest.approx(policy_loss.item() + 0.25 * value_loss.item(), rel=1e-5)
    assert metrics["critic/vf_loss"] == pytest.approx(value_loss.item(), rel=1e-5)
    loss.backward()
    assert policy.value_head.weight.grad.abs().sum() > 0  # the head trains in the policy's backward
    assert any(p is policy.value_head.weight for p in policy.trainable_parameters())
    # rollout-time values: no grad, the same numbers as the training forward's
    torch.testing.assert_close(
        critic.compute_values(batch), policy.values_from_hidden(hidden, batch).detach()
    )


def test_shared_head_is_saved_and_loaded(tiny_cache, tiny_model_path, tmp_path):
    cfg = load_config([f"model.tiny.cache_dir={tiny_cache}", "algorithm=ppo", "critic.shared_trunk=true"])
    critic = SharedTrunkCritic(HFPolicy(tiny_model_path, cfg), cfg)
    with torch.no_grad():
        critic.head.weight.normal_(0, 1.0)
    critic.save(tmp_path / "critic")
    again = SharedTrunkCritic(HFPolicy(tiny_model_path, cfg), cfg)
    again.load(tmp_path / "critic")
    torch.testing.assert_close(again.head.weight, critic.head.weight)
    with pytest.raises(CheckpointError, match="no shared-trunk value head"):
        again.load(tmp_path / "nothing")
