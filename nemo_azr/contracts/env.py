"""The environment interface of multi-step episodes (seeds 000/001): ``reset`` a task, ``step`` with
the model's actions, ``evaluate`` the finished episode by rule, and the transcript an LLM judge reads.
Environments live in ``nemo_azr/envs``; the rollout loop (``rollout/multi_step.py``) drives them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class EnvOutput:
    """What one ``step`` returns. ``observation`` is shown to the model as the next user turn
    (ignored when ``done``)."""

    observation: str
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalResult:
    """Rule-based scores of a finished episode, each in [0, 1].

    ``safety_score`` / ``completion_score`` are None when the environment has no rule for that
    dimension (then only the ``llm`` evaluator can score it). ``format_score`` measures whether the
    model's turns followed the required output format (the seeds' ``format_rewards``).
    """

    safety_score: float | None
    completion_score: float | None
    format_score: float
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    def reset(self, task_config: dict[str, Any]) -> str: ...

    def step(self, actions: str) -> EnvOutput: ...

    def evaluate(self) -> EvalResult: ...

    def get_history_messages(self) -> list[dict[str, str]]: ...


@runtime_checkable
class ClosableEnv(Protocol):
    """An environment holding something to free after its episode (a process, a sandbox)."""

    def close(self) -> None: ...
