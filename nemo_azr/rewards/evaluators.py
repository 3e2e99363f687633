"""Per-episode safety / completion / format scores from rules, an LLM judge, or both.

``absolute_zero.safety_evaluator_type`` and ``completion_evaluator_type`` pick, per dimension,
``rule`` (the environment's :class:`EvalResult` score) or ``llm`` (the judge with the matching
rubric). Every ``llm`` item of a call goes to the judge in ONE batched generate call, even when
both dimensions use it. The format score always comes from the environment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from nemo_azr.config.schema import AbsoluteZeroConfig
from nemo_azr.contracts.env import EvalResult
from nemo_azr.errors import ConfigError, RewardError
from nemo_azr.rewards.judge import LLMJudge

__all__ = ["DIMENSIONS", "EVALUATOR_TYPES", "EpisodeScores", "score_episodes"]

DIMENSIONS = ("safety", "completion")
EVALUATOR_TYPES = ("rule", "llm")


@dataclass
class EpisodeScores:
    """Scores per episode (same order as the inputs) and the judge metrics of this call."""

    safety: list[float]
    completion: list[float]
    format: list[float]
    metrics: dict[str, float] = field(default_factory=dict)


def _evaluator_types(cfg: AbsoluteZeroConfig, judge: LLMJudge | None) -> dict[str, str]:
    """The evaluator type of each dimension, checked before any scoring work is done."""
    types = {}
    for dim in DIMENSIONS:
        key = f"{dim}_evaluator_type"
        kind = getattr(cfg, key)
        if kind not in EVALUATOR_TYPES:
            raise ConfigError(f"absolute_zero.{key} must be one of {EVALUATOR_TYPES}, got {kind!r}")
        if kind == "llm" and judge is None:
            raise ConfigError(f"absolute_zero.{key}=llm needs an LLM judge, but none was built")
        types[dim] = kind
    return types


def _rule_scores(dim: str, eval_results: Sequence[EvalResult], env_name: str) -> list[float]:
    scores = []
    for i, result in enumerate(eval_results):
        value = getattr(result, f"{dim}_score")
        if value is None:
            raise ConfigError(
                f"absolute_zero.{dim}_evaluator_type=rule but env {env_name!r} has no rule for {dim} "
                f"(episode {i} has no {dim}_score); use llm"
            )
        scores.append(_checked(float(value), f"{dim}_score of episode {i}"))
    return scores


def _checked(value: float, what: str) -> float:
    # A NaN would poison the whole batch's advantages; fail loudly at the source instead.
    if not math.isfinite(value):
        raise RewardError(f"{what} is {value}; scores must be finite numbers in [0, 1]")
    return value


def score_episodes(
    eval_results: Sequence[EvalResult],
    histories: Sequence[Sequence[dict[str, str]]],
    cfg: AbsoluteZeroConfig,
    judge: LLMJudge | None,
) -> EpisodeScores:
    """Safety, completion and format score of every episode, per the configured evaluators.

    ``histories[i]`` is episode i's ``env.get_history_messages()`` (what the judge reads).
    Metrics: ``judge/calls`` (items judged in this call), ``judge/parse_failures``,
    ``judge/parse_failure_rate``, ``judge/<dim>_parse_failures`` and ``judge/rule_fallbacks``
    (``judge.on_parse_failure=rule``: replies replaced by the rule's score); all 0 when no judge is used.
    """
    if len(eval_results) != len(histories):
        raise ValueError(f"{len(eval_results)} eval results but {len(histories)} histories")
    types = _evaluator_types(cfg, judge)
    scores: dict[str, list[float]] = {}
    metrics: dict[str, float] = {f"judge/{dim}_parse_failures": 0.0 for dim in DIMENSIONS}
    metrics["judge/rule_fallbacks"] = 0.0

    llm_dims = [dim for dim in DIMENSIONS if types[dim] == "llm"]
    for dim in DIMENSIONS:
        if types[dim] == "rule":
            scores[dim] = _rule_scores(dim, eval_results, cfg.env)
    calls = failures = 0
    if llm_dims and eval_results:
        assert judge is not None  # checked by _evaluator_types
        n = len(histories)
        rubrics = [getattr(cfg.judge, f"{dim}_rubric") for dim in llm_dims for _ in range(n)]
        judged = judge.score_many([h for _ in llm_dims for h in histories], rubrics)
        fallbacks = 0
        for k, dim in enumerate(llm_dims):
            scores[dim] = judged.scores[k * n : (k + 1) * n]
            parsed = judged.parsed[k * n : (k + 1) * n]
            metrics[f"judge/{dim}_parse_failures"] = float(sum(not ok for ok in parsed))
            if cfg.judge.on_parse_failure == "rule" and not all(parsed):
                # the environment's rule stands in for a reply without a score (counted, never silent)
                rule = _rule_scores(dim, eval_results, cfg.env)
                scores[dim] = [v if ok else r for v, ok, r in zip(scores[dim], parsed, rule)]
                fallbacks += sum(not ok for ok in parsed)
        metrics["judge/rule_fallbacks"] = float(fallbacks)
        calls, failures = len(judged.scores), judged.num_failures
    elif llm_dims:
        scores.update({dim: [] for dim in llm_dims})
    metrics["judge/calls"] = float(calls)
    metrics["judge/parse_failures"] = float(failures)
    metrics["judge/parse_failure_rate"] = failures / calls if calls else 0.0

    fmt = [
        _checked(float(r.format_score), f"format_score of episode {i}") for i, r in enumerate(eval_results)
    ]
    return EpisodeScores(
        safety=scores["safety"], completion=scores["completion"], format=fmt, metrics=metrics
    )
