"""The reward stage: score rows with the task's reward (unless the workflow already did), then drop
and count unusable rewards so they never reach an update."""

from __future__ import annotations

import numbers

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import RewardError
from nemo_azr.tasks.base import Task


def score_batch(batch: Batch, task: Task) -> Batch:
    """Adds ``rewards[B]`` from ``task.reward(example, response_text)`` (values may be NaN/inf).
    A reward that is not a number at all is a bug in the reward function: :class:`RewardError`.
    """
    values = []
    for ex, text in zip(batch["example"], batch[F.RESPONSE_TEXT]):
        r = task.reward(ex, text)
        if not isinstance(r, numbers.Real):
            raise RewardError(
                f"task {task.name!r} returned reward {r!r} ({type(r).__name__}) for prompt {ex.prompt_id!r}; "
                "rewards must be real numbers"
            )
        values.append(float(r))
    batch[F.REWARDS] = torch.tensor(values, dtype=torch.float32)
    return batch


def drop_nonfinite_rewards(batch: Batch) -> tuple[Batch | None, dict[str, float]]:
    """Rows whose reward is NaN/inf are removed and counted in ``reward/nonfinite_rows``;
    None when no row is left."""
    rewards = batch[F.REWARDS]
    finite = torch.isfinite(rewards)
    metrics = {"reward/nonfinite_rows": float((~finite).sum())}
    if bool(finite.all()):
        return batch, metrics
    if not bool(finite.any()):
        return None, metrics
    return batch.index(finite), metrics
