"""What every critic backend shares: heads per role, its update schedule and its step metrics.

A critic is a :class:`~nemo_azr.models.training.ppo_update.PPOUpdateMixin` model whose "log-probs" are values:
``token_values(batch) -> [B, T]`` (the head of each row's role at the position before each trained
token, 0 elsewhere) trained with the clipped value loss. Backends: ``hf`` (models/hf/critic.py) and
``megatron`` (megatron/critic.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_azr.algorithms.value_loss import explained_variance
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.errors import BatchContractError

#: The critic's files inside a trainer checkpoint ``step_N/``.
CRITIC_DIR = "critic"

NO_CRITIC_HINT = (
    "it was written by a run without a critic; resume it with its own estimator, or start a new output_dir"
)


def role_heads(batch: Batch, roles: Sequence[str]) -> torch.Tensor:
    """``[B]`` index of each row's value head: its ``role`` (meta) in ``roles``; one head: all 0."""
    if len(roles) == 1:
        return torch.zeros(len(batch), dtype=torch.long)
    if F.ROLE not in batch.meta:
        raise BatchContractError(f"a critic with one value head per role {list(roles)} needs the meta 'role'")
    index = {r: i for i, r in enumerate(roles)}
    unknown = sorted(set(batch.meta[F.ROLE]) - set(index))
    if unknown:
        raise BatchContractError(f"rows with role(s) {unknown} have no value head; heads: {list(roles)}")
    return torch.tensor([index[r] for r in batch.meta[F.ROLE]], dtype=torch.long)


def pick_role_values(per_head: torch.Tensor, batch: Batch, roles: Sequence[str]) -> torch.Tensor:
    """``per_head[k, B, T]`` (every head's values) -> ``[B, T]``: each row's own role's head."""
    index = role_heads(batch, roles).to(per_head.device)
    return per_head.gather(0, index.view(1, -1, 1).expand(1, -1, per_head.shape[-1])).squeeze(0)


def require_value_targets(batch: Batch) -> None:
    """A critic update needs the rollout-time values and the returns (the gae estimator's)."""
    for key in (F.VALUES, F.RETURNS):
        if key not in batch.tensors:
            raise BatchContractError(f"critic update: the batch has no {key!r} [B,T] (run the gae estimator)")


class ValueModelMixin:
    """The critic side of the update loop (mix in before the backend's policy/update class)."""

    metric_prefix = "critic"
    roles: list[str]

    def update_schedule(self) -> tuple[int, int, bool]:
        c, alg = self.cfg.critic, self.cfg.algorithm
        return (
            c.ppo_epochs or alg.ppo_epochs,
            c.mini_batch_size or alg.mini_batch_size,
            alg.shuffle_mini_batches,
        )

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """No-grad ``values[B, T]``: the rollout-time values (GAE's input and the value clip's anchor)."""
        return self.compute_logprobs(batch)

    def update(self, batch: Batch, ctx: UpdateContext) -> dict[str, float]:
        """The critic's epochs over ``batch`` (with ``values`` and ``returns``) and how well the
        rollout-time values predicted the returns."""
        require_value_targets(batch)
        return {
            **super().update(batch, ctx),
            **value_batch_metrics(batch),
        }


def value_batch_metrics(batch: Batch) -> dict[str, float]:
    """How well the rollout-time ``values`` predicted the ``returns`` of ``batch`` (trained tokens)."""
    mask = batch[F.LOSS_MASK]
    count = mask.sum().clamp(min=1)
    return {
        "critic/explained_variance": explained_variance(batch[F.VALUES], batch[F.RETURNS], mask),
        "critic/returns_mean": float((batch[F.RETURNS] * mask).sum() / count),
        "critic/values_mean": float((batch[F.VALUES] * mask).sum() / count),
    }
