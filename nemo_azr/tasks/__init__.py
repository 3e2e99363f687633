"""Tasks: prompt datasets with gold answers and rewards. Importing this registers the built-ins."""

from __future__ import annotations

import random

from nemo_azr.config.schema import DataConfig
from nemo_azr.contracts.task import Example, Task
from nemo_azr.errors import DataError
from nemo_azr.registry import TASKS
from nemo_azr.tasks import arithmetic, jsonl, synthetic_qa  # noqa: F401  (registration)

__all__ = ["SPLITS", "Example", "Task", "build_task", "split_examples"]

SPLITS = ("train", "eval", "all")


def split_examples(examples: list[Example], eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, eval): ``eval_size`` examples drawn with ``seed`` are held out; order is kept."""
    if eval_size <= 0:
        return list(examples), list(examples)
    held = set(random.Random(seed).sample(range(len(examples)), eval_size))
    train = [ex for i, ex in enumerate(examples) if i not in held]
    return train, [ex for i, ex in enumerate(examples) if i in held]


def build_task(cfg: DataConfig, split: str = "train") -> Task:
    """The task named by ``cfg.task`` (registry TASKS) restricted to ``split``: ``train`` (all but the
    ``data.eval_size`` held-out examples), ``eval`` (those; all when eval_size is 0) or ``all``."""
    task = TASKS.get(cfg.task)(cfg)
    if not task.examples:
        raise DataError(f"task {cfg.task!r} has no examples; check the data config")
    if cfg.eval_size and cfg.eval_size >= len(task.examples):
        raise DataError(
            f"data.eval_size={cfg.eval_size} leaves nothing to train on: task {cfg.task!r} has "
            f"{len(task.examples)} examples"
        )
    if split != "all":
        train, held_out = split_examples(task.examples, cfg.eval_size, cfg.split_seed)
        task.examples = train if split == "train" else held_out
    return task
