"""RL algorithm math: advantage estimators, KL estimators, policy losses and loss aggregation.

Importing this package registers the estimators in ``ADVANTAGE_ESTIMATORS`` and the losses in
``POLICY_LOSSES``.
"""

from nemo_azr.algorithms import advantages, aggregation, grouping, kl, losses, objective
from nemo_azr.algorithms.advantages import (
    advantage_estimator,
    grpo,
    reinforce_plus_plus,
    remax,
    rewards_at_last_token,
    rloo,
    sequence_rewards,
)
from nemo_azr.algorithms.aggregation import AGG_MODES, aggregate_loss, masked_mean
from nemo_azr.algorithms.grouping import (
    group_index,
    group_mean,
    group_range,
    group_size,
    group_std,
    group_sum,
)
from nemo_azr.algorithms.kl import KL_ESTIMATORS, KL_MODES, kl_penalty
from nemo_azr.algorithms.losses import gspo, ppo_clip
from nemo_azr.algorithms.objective import apply_kl_reward_penalty, policy_objective

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "KL_MODES",
    "advantage_estimator",
    "advantages",
    "aggregate_loss",
    "aggregation",
    "apply_kl_reward_penalty",
    "group_index",
    "group_mean",
    "group_range",
    "group_size",
    "group_std",
    "group_sum",
    "grouping",
    "grpo",
    "gspo",
    "kl",
    "kl_penalty",
    "losses",
    "masked_mean",
    "objective",
    "policy_objective",
    "ppo_clip",
    "reinforce_plus_plus",
    "remax",
    "rewards_at_last_token",
    "rloo",
    "sequence_rewards",
]
