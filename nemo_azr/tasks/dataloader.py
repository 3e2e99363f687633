"""Endless, reproducible batches of prompts with a resumable position.

Each epoch's order is a permutation drawn from a generator seeded with ``seed + epoch``, so the
order depends only on (seed, epoch) and a resumed run continues exactly where it stopped.
:class:`FeedbackCurriculumLoader` (``data.curriculum=feedback``) instead samples each batch by how
useful each prompt's last rollouts were (``PROMPT_FEEDBACK``), its state saved with the position.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from nemo_azr.errors import CheckpointError, ConfigError, DataError
from nemo_azr.tasks.base import Example

log = logging.getLogger(__name__)


class PromptLoader:
    """Full batches of :class:`Example`, wrapping across epochs (a batch may span two)."""

    def __init__(self, examples: Sequence[Example], batch_size: int, *, shuffle: bool, seed: int) -> None:
        if not examples:
            raise DataError("no prompts to load: the task has no examples")
        if batch_size <= 0:
            raise ConfigError(f"prompt batch size must be > 0, got {batch_size}")
        self.examples = list(examples)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0  # index into the current epoch's order
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.examples)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.examples), generator=generator).tolist()

    def next_batch(self) -> list[Example]:
        batch: list[Example] = []
        while len(batch) < self.batch_size:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            take = min(self.batch_size - len(batch), len(self._order) - self.position)
            batch.extend(self.examples[i] for i in self._order[self.position : self.position + take])
            self.position += take
        return batch

    def record(self, feedback: dict[str, float]) -> None:
        """Per-prompt usefulness of the last rollout (``PROMPT_FEEDBACK``); the plain loader ignores it."""

    def __iter__(self) -> Iterator[list[Example]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_examples": len(self.examples),
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the dataset must be the one the state was saved with."""
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"prompt loader state is incomplete or malformed: {state!r}") from exc
        saved_size = state.get("num_examples", len(self.examples))
        if saved_size != len(self.examples):
            raise CheckpointError(
                f"prompt loader state was saved for {saved_size} prompts, but the task now has "
                f"{len(self.examples)}; the data changed since the checkpoint"
            )
        if epoch < 0 or not 0 <= position <= len(self.examples):
            raise CheckpointError(f"prompt loader state out of range: epoch={epoch}, position={position}")
        self.epoch, self.position = epoch, position
        self._order = self._epoch_order(epoch)


class FeedbackCurriculumLoader(PromptLoader):
    """Batches drawn by usefulness: prompt ``i`` is drawn with weight ``floor + u_i``, where ``u_i`` is an
    exponential moving average (``decay``) of the feedback its rollouts got (1.0 before any: every
    prompt is tried before the curriculum narrows). Distinct prompts per batch while there are enough.

    Why: in self-play a seed whose question groups keep missing the learnability band costs a
    proposal and ``rollout_n`` solver episodes per step and trains nothing; the seeds that last reached
    the band are where the proposer and solver both learn. ``floor`` keeps every prompt in play.
    """

    def __init__(
        self, examples: Sequence[Example], batch_size: int, *, seed: int, floor: float, decay: float
    ) -> None:
        super().__init__(examples, batch_size, shuffle=True, seed=seed)
        if floor <= 0 or not 0 <= decay < 1:
            raise ConfigError(f"curriculum floor must be > 0 and decay in [0, 1), got {floor} and {decay}")
        self.floor, self.decay = floor, decay
        self.usefulness = {e.prompt_id: 1.0 for e in self.examples}
        self.draws = 0

    def next_batch(self) -> list[Example]:
        weights = torch.tensor([self.floor + self.usefulness[e.prompt_id] for e in self.examples])
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        distinct = self.batch_size <= len(self.examples)
        picks = torch.multinomial(weights, self.batch_size, replacement=not distinct, generator=generator)
        return [self.examples[i] for i in picks.tolist()]

    def record(self, feedback: dict[str, float]) -> None:
        for prompt_id, value in feedback.items():
            if prompt_id in self.usefulness:  # a prompt of another task (e.g. eval) is not ours
                old = self.usefulness[prompt_id]
                self.usefulness[prompt_id] = self.decay * old + (1 - self.decay) * min(
                    max(float(value), 0.0), 1.0
                )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "draws": self.draws, "usefulness": dict(self.usefulness)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved curriculum; a state saved without one (the curriculum switched on at a
        resume, e.g. from a warm-up checkpoint) starts it afresh, with a warning."""
        super().load_state_dict(state)
        if "draws" not in state and "usefulness" not in state:
            log.warning(
                "the checkpoint's prompt loader had no curriculum: data.curriculum=feedback starts afresh"
            )
            return
        try:
            draws, usefulness = (
                int(state["draws"]),
                {str(k): float(v) for k, v in state["usefulness"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"prompt loader curriculum state is malformed: {exc}") from exc
        if set(usefulness) != set(self.usefulness):
            raise CheckpointError(
                "the curriculum state names other prompts than the task's: the data changed"
            )
        self.draws, self.usefulness = draws, usefulness


def build_prompt_loader(examples: Sequence[Example], data_cfg, seed: int) -> PromptLoader:
    """The loader ``cfg.data`` asks for: plain epochs, or the feedback curriculum."""
    if data_cfg.curriculum == "feedback":
        return FeedbackCurriculumLoader(
            examples,
            data_cfg.prompts_per_step,
            seed=seed,
            floor=data_cfg.curriculum_floor,
            decay=data_cfg.curriculum_decay,
        )
    return PromptLoader(examples, data_cfg.prompts_per_step, shuffle=data_cfg.shuffle, seed=seed)
