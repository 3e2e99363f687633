"""The reward stage with a reward model (``reward_model.path``; seed 004 class 4).

After the task's rule reward, each reply is scored by the reward model on the prompt as the task
presents it, and the row's reward becomes ``rule_weight * rule + weight * score``. With
``rule_weight = 0`` the rule is not part of the reward (a rule that failed on a row does not drop
it); its mean is still logged beside the model's, which is how reward hacking shows: the model's
score rising while the rule's accuracy does not.
"""

from __future__ import annotations

import math

import torch

from nemo_azr.config.schema import RewardModelConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.capabilities import RewardScorer
from nemo_azr.contracts.task import Task

__all__ = ["add_reward_model_scores"]


def add_reward_model_scores(
    batch: Batch, model: RewardScorer, task: Task, cfg: RewardModelConfig
) -> dict[str, float]:
    """Mix the model's scores into ``batch[rewards]`` (in place); ``reward/model_score_mean`` and
    ``reward/rule_mean`` (over rows whose rule reward is a number)."""
    scores = model.score([task.messages(ex) for ex in batch["example"]], batch.meta[F.RESPONSE_TEXT])
    rule = batch[F.REWARDS].float()
    mixed = cfg.weight * scores
    if cfg.rule_weight:
        mixed = mixed + cfg.rule_weight * rule
    batch[F.REWARDS] = mixed.float()
    finite = torch.isfinite(rule)
    return {
        "reward/model_score_mean": float(scores.mean()),
        "reward/model_score_std": float(scores.std()) if len(scores) > 1 else 0.0,
        "reward/rule_mean": float(rule[finite].mean()) if bool(finite.any()) else math.nan,
    }
