"""The reward stage: score each row with the task's reward, drop (and count) unusable rewards."""

from __future__ import annotations

import math
import numbers

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import RewardError
from nemo_azr.tasks.base import Task


def score_batch(batch: Batch, task: Task) -> tuple[Batch | None, dict[str, float]]:
    """Adds ``rewards[B]``. Rows whose reward is NaN/inf are removed and counted in
    ``reward/nonfinite_rows`` (so they never reach the update); returns None if no row is left.
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
    finite = torch.tensor([math.isfinite(v) for v in values], dtype=torch.bool)
    rewards = torch.tensor([v if math.isfinite(v) else 0.0 for v in values], dtype=torch.float32)
    metrics = {"reward/nonfinite_rows": float((~finite).sum())}
    batch[F.REWARDS] = rewards
    if bool(finite.all()):
        return batch, metrics
    if not bool(finite.any()):
        return None, metrics
    return batch.index(finite), metrics
