"""The reward stage: score rows with the task's reward (unless the workflow already did), then drop
and count unusable rewards so they never reach an update."""

from __future__ import annotations

import numbers

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.capabilities import ExplainsRewards
from nemo_azr.contracts.task import Task
from nemo_azr.errors import RewardError


def score_batch(batch: Batch, task: Task, *, errors: str = "drop") -> Batch:
    """Adds ``rewards[B]`` from ``task.reward(example, response_text)`` (values may be NaN/inf).

    A reward that is not a number at all is a bug in the reward function: :class:`RewardError`.
    A reward function that raises on a row: with ``errors="drop"`` (training) the row's reward is
    NaN, so the next stage drops it, counted in ``batch.info["reward_errors"]`` with the first
    failure's text (one bad row must not end a multi-day run; a function that always raises ends it
    through ``trainer.max_skipped_steps``); with ``errors="raise"`` (evaluation, whose scores would
    be wrong) it is one :class:`RewardError` line naming the task and the prompt.
    """
    values = []
    failed, first_failure = 0, ""
    explains = isinstance(task, ExplainsRewards)
    reasons: dict[str, int] = {}
    for ex, text in zip(batch["example"], batch[F.RESPONSE_TEXT]):
        try:
            r = task.reward(ex, text)
            if explains:
                reason = task.answer_rejection(ex, text)
                if reason:
                    reasons[reason] = reasons.get(reason, 0) + 1
        except Exception as exc:  # user reward code: any failure is reported the same way
            where = (
                f"the reward of task {task.name!r} raised {type(exc).__name__}: {exc} "
                f"(prompt {ex.prompt_id!r})"
            )
            if errors == "raise":
                raise RewardError(where) from None
            failed += 1
            first_failure = first_failure or where
            values.append(float("nan"))
            continue
        if not isinstance(r, numbers.Real):
            raise RewardError(
                f"task {task.name!r} returned reward {r!r} ({type(r).__name__}) for prompt {ex.prompt_id!r}; "
                "rewards must be real numbers"
            )
        values.append(float(r))
    batch[F.REWARDS] = torch.tensor(values, dtype=torch.float32)
    if failed:
        batch.info["reward_errors"] = {"count": failed, "first": first_failure}
    if explains:  # every reason the task knows, 0 when absent, so the metric columns stay fixed
        known = task.rejection_reasons()
        batch.info["answer_rejections"] = {reason: reasons.get(reason, 0) for reason in (*known, *reasons)}
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
