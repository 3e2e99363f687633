"""Absolute Zero self-play (seeds 000/001): learnability filter, re-propose loop, sampling,
proposer rewards and the joint proposer + solver batch. Importing it registers the ``azr`` workflow."""

from nemo_azr.selfplay.joint_batch import SELFPLAY_META, SolvedGroup, build_joint_batch
from nemo_azr.selfplay.learnability import (
    PROPOSER_REWARDS,
    REPROPOSE_INDEX,
    GroupFilterResult,
    QuestionScores,
    UnifiedFilterResult,
    check_learnability,
    compute_unified_reward_and_filter,
    filter_group,
    harm_reward,
    incomplete_ratio,
    needs_repropose,
    proposer_reward,
    safe_ratio,
    sample_learnable_index,
)
from nemo_azr.selfplay.proposer import Proposal, ProposerTrajectory, propose
from nemo_azr.selfplay.workflow import AbsoluteZeroWorkflow

__all__ = [
    "PROPOSER_REWARDS",
    "REPROPOSE_INDEX",
    "SELFPLAY_META",
    "AbsoluteZeroWorkflow",
    "GroupFilterResult",
    "Proposal",
    "ProposerTrajectory",
    "QuestionScores",
    "SolvedGroup",
    "UnifiedFilterResult",
    "build_joint_batch",
    "check_learnability",
    "compute_unified_reward_and_filter",
    "filter_group",
    "harm_reward",
    "incomplete_ratio",
    "needs_repropose",
    "propose",
    "proposer_reward",
    "safe_ratio",
    "sample_learnable_index",
]
