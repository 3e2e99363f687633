"""The seeds' self-play metrics (seed 000 "输出指标", seed 001 "输出指标").

``unified_filter/*`` and ``harm/*`` describe the final state of every prompt's group (after the
re-propose loop), as the seeds recompute them in the last filter pass; ``initial_learnable_ratio``
is the first pass alone (the proposer's quality before any re-proposal).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nemo_azr.contracts import Batch, Role
from nemo_azr.contracts import fields as F
from nemo_azr.selfplay.joint_batch import INFO_KEY, SolvedGroup
from nemo_azr.selfplay.learnability import band_misses


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def filter_metrics(groups: Sequence[SolvedGroup], *, prefix: str = "unified_filter") -> dict[str, float]:
    learnable = [flag for g in groups for flag in g.result.learnable]
    total = len(learnable)
    return {
        f"{prefix}/num_learnable": float(sum(learnable)),
        f"{prefix}/num_total": float(total),
        f"{prefix}/learnable_ratio": sum(learnable) / total if total else 0.0,
        f"{prefix}/num_sampled": float(sum(not g.result.flagged for g in groups)),
        f"{prefix}/num_repropose": float(sum(g.result.flagged for g in groups)),
        # how near the proposals come to the band (1.0 = a question inside it; see band_closeness)
        f"{prefix}/band_closeness_mean": _mean([g.result.best_closeness for g in groups]),
    }


def band_miss_metrics(
    groups: Sequence[SolvedGroup], cfg: Any, *, prefix: str = "unified_filter/initial"
) -> dict[str, float]:
    """Share of the questions that miss each side of each band (``{prefix}_too_safe_share``, ...):
    whether the solver outgrew the temptations (too safe), or the success checks cannot tell
    (too complete: always met; too incomplete: never met, often a check the proposer got wrong)."""
    misses = [band_misses(s, c, cfg) for g in groups for s, c in zip(g.safety, g.completion)]
    return {
        f"{prefix}_{side}_share": _mean([float(m[side]) for m in misses])
        for side in ("too_safe", "too_unsafe", "too_complete", "too_incomplete")
    }


def harm_metrics(groups: Sequence[SolvedGroup]) -> dict[str, float]:
    safety = [s for g in groups for q in g.safety for s in q]
    completion = [c for g in groups for q in g.completion for c in q]
    combined = [r for g in groups for q in g.result.harm_rewards for r in q]
    fmt = [f for g in groups for q in g.format for f in q]
    return {
        "harm/safety_score_mean": _mean(safety),
        "harm/completion_score_mean": _mean(completion),
        "harm/combined_reward_mean": _mean(combined),
        "harm/format_reward_mean": _mean(fmt),
    }


def joint_metrics(batch: Batch, *, num_trajectories: int) -> dict[str, float]:
    """``proposer/*`` and ``joint/*`` from the final joint batch.

    ``proposer/reward_mean`` averages every prompt's proposer reward; ``joint/proposer_solver_ratio``
    = that mean / the mean solver ``rewards`` (before the proposer term), 0 when the solver mean is
    0 or either role is absent.
    """
    roles = batch.get(F.ROLE, [])
    rewards = batch[F.REWARDS].tolist() if F.REWARDS in batch else []
    solver = [i for i, r in enumerate(roles) if r == Role.SOLVER.value]
    proposer = [i for i, r in enumerate(roles) if r == Role.PROPOSER.value]
    by_prompt = batch.info.get(INFO_KEY, {}).get("proposer_rewards", {})
    p_mean = _mean(list(by_prompt.values()))
    solver_mean = _mean([batch["solver_reward"][i] for i in solver])
    return {
        "proposer/num_trajectories": float(num_trajectories),
        "proposer/num_integrated": float(len(proposer)),
        "proposer/reward_mean": p_mean,
        "joint/combined_reward_mean": _mean([rewards[i] for i in solver]),
        "joint/solver_reward_mean": solver_mean,
        "joint/proposer_solver_ratio": p_mean / solver_mean if solver and proposer and solver_mean else 0.0,
        "joint/num_solver_rows": float(len(solver)),
        "joint/num_proposer_rows": float(len(proposer)),
    }


def plain_metrics(batch: Batch) -> dict[str, float]:
    """``plain/*`` from the plain tasks' rows (``absolute_zero.solver_plain_tasks``; joint_batch.build_plain_rows)."""
    harm_by_group: dict[str, set[float]] = {}
    for group, harm in zip(batch.get(F.GROUP_ID, []), batch.get("harm_reward", [])):
        harm_by_group.setdefault(group, set()).add(harm)
    return {
        "plain/safety_score_mean": _mean(batch.get("safety_score", [])),
        "plain/completion_score_mean": _mean(batch.get("completion_score", [])),
        "plain/harm_reward_mean": _mean(batch.get("harm_reward", [])),
        # groups whose rewards differ: only those move the solver under a group baseline
        "plain/informative_group_ratio": _mean([float(len(h) > 1) for h in harm_by_group.values()]),
    }
