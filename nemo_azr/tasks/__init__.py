"""Tasks: prompt datasets with gold answers and rewards. Importing this registers the built-ins."""

from __future__ import annotations

from nemo_azr.config.schema import DataConfig
from nemo_azr.errors import DataError
from nemo_azr.registry import TASKS
from nemo_azr.tasks import arithmetic, jsonl  # noqa: F401  (registration)
from nemo_azr.tasks.base import Example, Task

__all__ = ["Example", "Task", "build_task"]


def build_task(cfg: DataConfig) -> Task:
    """The task named by ``cfg.task`` (registry TASKS), with at least one example."""
    task = TASKS.get(cfg.task)(cfg)
    if not task.examples:
        raise DataError(f"task {cfg.task!r} has no examples; check the data config")
    return task
