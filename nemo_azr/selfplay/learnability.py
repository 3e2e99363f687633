"""The unified reward and learnability filter (seed 000 step 5, seed 001 steps 6-7 and 11).

Per response the harm reward is ``safety_reward_weight * safety + task_completion_weight *
completion``. A question (``rollout_n`` responses) is *learnable* when both band conditions hold::

    safe_ratio       = #(safety_score > learnability_safety_threshold) / rollout_n
    incomplete_ratio = #(completion_score < learnability_completion_threshold) / rollout_n
    learnability_min_safe_ratio       <= safe_ratio       <= learnability_max_safe_ratio
    learnability_min_incomplete_ratio <= incomplete_ratio <= learnability_max_incomplete_ratio

A prompt's question group in which every question is learnable, or none is, is flagged for
re-proposal (``sampled_index = -1``); a mixed group gets one learnable question sampled uniformly.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Index of a group that must be re-proposed (the seeds' ``sampled_idx = -1``).
REPROPOSE_INDEX = -1
#: Proposer reward by the prompt's final status (seed 001 step 11).
PROPOSER_REWARDS = {"learnable": 1.0, "not_learnable": 0.0, "repropose": -0.5}
#: Ratios are k / rollout_n; the tolerance keeps "ratio == bound" inclusive despite float rounding
#: (e.g. a bound of 0.3 written in YAML vs 3 / 10 computed here).
_RATIO_TOL = 1e-9


def _ratio(count: int, n: int) -> float:
    return count / n


def safe_ratio(safety_scores: Sequence[float], cfg: Any) -> float:
    """Share of responses with ``safety_score > learnability_safety_threshold`` (strictly)."""
    thr = cfg.learnability_safety_threshold
    return _ratio(sum(s > thr for s in safety_scores), len(safety_scores))


def incomplete_ratio(completion_scores: Sequence[float], cfg: Any) -> float:
    """Share of responses with ``completion_score < learnability_completion_threshold`` (strictly)."""
    thr = cfg.learnability_completion_threshold
    return _ratio(sum(c < thr for c in completion_scores), len(completion_scores))


def _within(value: float, low: float, high: float) -> bool:
    return low - _RATIO_TOL <= value <= high + _RATIO_TOL


def _band_axes(
    safety_scores: Sequence[float], completion_scores: Sequence[float], cfg: Any
) -> list[tuple[float, float, float]]:
    """(ratio, low, high) of the two bands: the safe ratio and the incomplete ratio."""
    return [
        (safe_ratio(safety_scores, cfg), cfg.learnability_min_safe_ratio, cfg.learnability_max_safe_ratio),
        (
            incomplete_ratio(completion_scores, cfg),
            cfg.learnability_min_incomplete_ratio,
            cfg.learnability_max_incomplete_ratio,
        ),
    ]


def band_misses(
    safety_scores: Sequence[float], completion_scores: Sequence[float], cfg: Any
) -> dict[str, bool]:
    """Which side of which band one question misses: ``too_safe`` / ``too_unsafe`` (safe ratio above /
    below its band), ``too_complete`` / ``too_incomplete`` (incomplete ratio below / above its band).
    A question inside both bands misses none; one may miss on both axes."""
    (safe, s_lo, s_hi), (incomplete, i_lo, i_hi) = _band_axes(safety_scores, completion_scores, cfg)
    return {
        "too_safe": safe > s_hi + _RATIO_TOL,
        "too_unsafe": safe < s_lo - _RATIO_TOL,
        "too_complete": incomplete < i_lo - _RATIO_TOL,
        "too_incomplete": incomplete > i_hi + _RATIO_TOL,
    }


def _band_distance(value: float, low: float, high: float) -> float:
    """How far ``value`` lies outside ``[low, high]``, as a share of the farthest it could lie (0 inside
    the band, 1 at 0.0 or 1.0 when that end is the farther one)."""
    farthest = max(low, 1.0 - high)
    if farthest <= 0.0:
        return 0.0
    return max(0.0, low - value, value - high) / farthest


def band_closeness(safety_scores: Sequence[float], completion_scores: Sequence[float], cfg: Any) -> float:
    """1.0 for a question inside both bands, down to 0.0 at the farthest corner: one minus the mean
    of the safe and incomplete ratios' normalised distances to their bands.

    The seeds' proposer reward is binary in the band, so once the solver is safer than the band's
    top every proposal earns the same -0.5 and the proposer has no direction to move in; this
    grades a miss (4 of 5 safe is closer than 5 of 5) for ``proposer_band_reward_weight``.
    """
    distances = [_band_distance(*axis) for axis in _band_axes(safety_scores, completion_scores, cfg)]
    return 1.0 - sum(distances) / len(distances)


def check_learnability(safety_scores: Sequence[float], completion_scores: Sequence[float], cfg: Any) -> bool:
    """Whether one question (its ``rollout_n`` responses' scores) lies inside both bands (inclusive)."""
    if len(safety_scores) == 0 or len(safety_scores) != len(completion_scores):
        raise ValueError(
            "check_learnability needs one safety and one completion score per response, got "
            f"{len(safety_scores)} and {len(completion_scores)}"
        )
    return all(_within(*axis) for axis in _band_axes(safety_scores, completion_scores, cfg))


def needs_repropose(learnable_flags: Sequence[bool]) -> bool:
    """A group is re-proposed when all its questions are learnable or none is (an empty group -
    an unparseable proposal - has nothing to sample, so it is re-proposed too)."""
    flags = [bool(f) for f in learnable_flags]
    return all(flags) or not any(flags)


def proposer_reward(status: str) -> float:
    """1.0 ``learnable``, 0.0 ``not_learnable``, -0.5 ``repropose`` (still flagged after the last attempt)."""
    try:
        return PROPOSER_REWARDS[status]
    except KeyError:
        raise ValueError(
            f"unknown proposer status {status!r}; known: {', '.join(PROPOSER_REWARDS)}"
        ) from None


def harm_reward(safety: float, completion: float, cfg: Any) -> float:
    """The seeds' ``combined_reward`` of one response."""
    return cfg.safety_reward_weight * safety + cfg.task_completion_weight * completion


def sample_learnable_index(learnable_flags: Sequence[bool], rng: random.Random) -> int:
    """The seeds' sampling rule: flagged groups get ``REPROPOSE_INDEX``, mixed groups one learnable
    question chosen uniformly with ``rng``."""
    if needs_repropose(learnable_flags):
        return REPROPOSE_INDEX
    return rng.choice([i for i, flag in enumerate(learnable_flags) if flag])


@dataclass
class QuestionScores:
    """The scores of one question's ``rollout_n`` responses."""

    safety: list[float]
    completion: list[float]


@dataclass
class GroupFilterResult:
    """One prompt's question group after the filter."""

    harm_rewards: list[list[float]]  # [question][response]
    learnable: list[bool]  # [question]
    sampled_index: int  # >= 0: the kept question; REPROPOSE_INDEX: flagged
    closeness: list[float] = field(default_factory=list)  # [question]: band_closeness

    @property
    def best_closeness(self) -> float:
        """The group's closest question to the band (0.0 for an empty group: nothing parsed)."""
        return max(self.closeness, default=0.0)

    @property
    def flagged(self) -> bool:
        return self.sampled_index == REPROPOSE_INDEX

    @property
    def status(self) -> str:
        """The proposer status this group earns if it is final."""
        if self.flagged:
            return "repropose"
        return "learnable" if self.learnable[self.sampled_index] else "not_learnable"


@dataclass
class UnifiedFilterResult:
    groups: dict[str, GroupFilterResult] = field(default_factory=dict)  # by prompt_id

    @property
    def sampled_indices(self) -> dict[str, int]:
        return {pid: g.sampled_index for pid, g in self.groups.items()}

    def flagged_prompts(self) -> list[str]:
        return [pid for pid, g in self.groups.items() if g.flagged]


def filter_group(
    questions: Sequence[QuestionScores],
    cfg: Any,
    rng: random.Random,
    repeat_keys: Sequence[Hashable] | None = None,
) -> GroupFilterResult:
    """Harm rewards, learnability and the sampled index of one prompt's question group.

    ``repeat_keys`` (one per question) says which questions are the same question: those are judged
    as one, on their responses pooled, and the group's mixed-or-flagged test and the sampling draw
    see each distinct question once (``absolute_zero.group_repeats: merge``; the kept index is the
    first copy's). ``None`` gives every question its own key: the seeds' rule, draw for draw.
    """
    keys: list[Hashable] = list(range(len(questions))) if repeat_keys is None else list(repeat_keys)
    if len(keys) != len(questions):
        raise ValueError(f"filter_group got {len(keys)} repeat keys for {len(questions)} questions")
    rewards = [[harm_reward(s, c, cfg) for s, c in zip(q.safety, q.completion)] for q in questions]
    first_index: dict[Hashable, int] = {}
    pooled: dict[Hashable, QuestionScores] = {}
    for index, (key, q) in enumerate(zip(keys, questions)):
        first_index.setdefault(key, index)
        scores = pooled.setdefault(key, QuestionScores([], []))
        scores.safety.extend(q.safety)
        scores.completion.extend(q.completion)
    key_learnable = {k: check_learnability(q.safety, q.completion, cfg) for k, q in pooled.items()}
    key_closeness = {k: band_closeness(q.safety, q.completion, cfg) for k, q in pooled.items()}
    # the seeds' draw over the distinct questions, mapped back to each one's first copy
    drawn = sample_learnable_index([key_learnable[k] for k in first_index], rng)
    sampled = REPROPOSE_INDEX if drawn == REPROPOSE_INDEX else list(first_index.values())[drawn]
    return GroupFilterResult(
        rewards, [key_learnable[k] for k in keys], sampled, [key_closeness[k] for k in keys]
    )


def compute_unified_reward_and_filter(
    groups: dict[str, Sequence[QuestionScores]], cfg: Any, rng: random.Random
) -> UnifiedFilterResult:
    """The seeds' ``_compute_unified_reward_and_filter`` over prompt groups, in ``groups`` order (so
    the RNG draws are reproducible)."""
    return UnifiedFilterResult({pid: filter_group(qs, cfg, rng) for pid, qs in groups.items()})
