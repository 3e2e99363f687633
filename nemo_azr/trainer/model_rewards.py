"""The reward stage with a reward model (``reward_model.path``; seed 004 class 4).

After the task's rule reward, each reply is scored by the reward model on the prompt as the task
presents it, and the row's reward becomes ``rule_weight * rule + weight * score``. With
``rule_weight = 0`` the rule is not part of the reward (a rule that failed on a row does not drop
it); its mean is still logged beside the model's, which is how reward hacking shows: the model's
score rising while the rule's accuracy does not.

Per token (``reward_model.per_token``): the model scores every prefix of the row in the policy's
own tokens, and each response token is rewarded by how much it moved the score,
``s_t - s_{t-1}`` (the first one against the prompt's last token). The rewards of a reply sum to
``s_last - s_prompt``: the sequence score less a constant per prompt, which a group baseline removes;
a critic (GAE) sees where in the reply the score rose or fell.
"""

from __future__ import annotations

import math

import torch

from nemo_azr.algorithms.advantages import rewards_at_last_token
from nemo_azr.config.schema import RewardModelConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.capabilities import RewardScorer
from nemo_azr.contracts.task import Task

__all__ = ["add_reward_model_scores", "score_differences"]


def score_differences(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: ``scores[t] - scores[t-1]`` at every ``loss_mask`` position, 0 elsewhere.

    Rows are ``[left-padded prompt | right-padded response]``, so the column before a response token
    is the previous real token (the prompt's last for the first one)."""
    previous = torch.zeros_like(scores)
    previous[:, 1:] = scores[:, :-1]
    return (scores - previous) * loss_mask.to(scores.dtype)


def add_reward_model_scores(
    batch: Batch, model: RewardScorer, task: Task, cfg: RewardModelConfig
) -> dict[str, float]:
    """Mix the model's scores into ``batch[rewards]`` (in place; per token also ``token_rewards``);
    ``reward/model_score_mean`` and ``reward/rule_mean`` (over rows whose rule reward is a number)."""
    rule = batch[F.REWARDS].float()
    if cfg.per_token:
        mask = batch[F.LOSS_MASK]
        dense = score_differences(model.token_scores(batch[F.INPUT_IDS], batch[F.ATTENTION_MASK]), mask)
        scores = dense.sum(-1)
        token_rewards = cfg.weight * dense
        if cfg.rule_weight:
            token_rewards = token_rewards + rewards_at_last_token(cfg.rule_weight * rule, mask)
        batch[F.TOKEN_REWARDS] = token_rewards.float()
        batch[F.REWARDS] = token_rewards.sum(-1).float()
    else:
        scores = model.score([task.messages(ex) for ex in batch["example"]], batch.meta[F.RESPONSE_TEXT])
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
