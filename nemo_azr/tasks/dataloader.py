"""Endless, reproducible batches of prompts with a resumable position.

Each epoch's order is a permutation drawn from a generator seeded with ``seed + epoch``, so the
order depends only on (seed, epoch) and a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from nemo_azr.errors import CheckpointError, ConfigError, DataError
from nemo_azr.tasks.base import Example


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
