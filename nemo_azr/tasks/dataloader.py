"""Endless, reproducible batches of prompts with a resumable position.

Each epoch's order is a permutation drawn from a generator seeded with ``seed + epoch``, so the
order depends only on (seed, epoch) and a resumed run continues exactly where it stopped.
:class:`WeightedPromptLoader` (``data.kind_weights``) draws each batch with a fixed weight per kind of
question; :class:`FeedbackCurriculumLoader` (``data.curriculum=feedback``) samples each batch by how
useful each prompt's last rollouts were (``PROMPT_FEEDBACK``), its state saved with the position.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from nemo_azr.contracts.task import Example
from nemo_azr.errors import CheckpointError, ConfigError, DataError

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


def kind_weight_vector(examples: Sequence[Example], kind_weights: dict[str, float]) -> torch.Tensor:
    """Per-example draw weight from ``data.kind_weights`` (``Example.meta["kind"]``; 1.0 for a kind not
    named). A named kind the task does not have, or a weight <= 0, is a config error."""
    kinds = {str(e.meta.get("kind", "")) for e in examples}
    unknown = sorted(set(kind_weights) - kinds)
    if unknown:
        known = ", ".join(sorted(k for k in kinds if k)) or "none (this task's examples have no kind)"
        raise ConfigError(
            f"data.kind_weights names kind(s) {unknown} the task does not have; its kinds: {known}"
        )
    bad = {k: v for k, v in kind_weights.items() if not float(v) > 0}
    if bad:
        raise ConfigError(f"data.kind_weights must be > 0 for every kind named, got {bad}")
    return torch.tensor([float(kind_weights.get(str(e.meta.get("kind", "")), 1.0)) for e in examples])


class WeightedPromptLoader(PromptLoader):
    """Batches drawn (distinct while there are enough prompts, seeded by the draw count, so a resumed
    run continues exactly) with a fixed weight per prompt: ``data.kind_weights`` gives a kind of
    question a larger share of the steps than its share of the data, e.g. a hard operation whose
    groups rarely carry a learning signal (docs/real_model.md)."""

    def __init__(
        self, examples: Sequence[Example], batch_size: int, *, seed: int, weights: torch.Tensor
    ) -> None:
        super().__init__(examples, batch_size, shuffle=True, seed=seed)
        if weights.shape != (len(self.examples),) or not bool((weights > 0).all()):
            raise ConfigError("prompt weights must be one positive number per example")
        self.base_weights = weights.to(torch.float64)
        self.draws = 0

    def weights(self) -> torch.Tensor:
        return self.base_weights

    def next_batch(self) -> list[Example]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        distinct = self.batch_size <= len(self.examples)
        picks = torch.multinomial(
            self.weights(), self.batch_size, replacement=not distinct, generator=generator
        )
        return [self.examples[i] for i in picks.tolist()]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "draws" not in state:
            log.warning(
                "the checkpoint's prompt loader drew no weighted batches: the weighted draws start afresh"
            )
            return
        try:
            self.draws = int(state["draws"])
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"prompt loader draw count is malformed: {state['draws']!r}") from exc


def curriculum_weights(usefulness: torch.Tensor, floor: float, rank_temperature: float = 0.0) -> torch.Tensor:
    """Draw weights of the feedback curriculum: ``floor + usefulness``, or with ``rank_temperature`` > 0
    ``floor + (1 / rank) ** (1 / rank_temperature)``, rank 1 the most useful (ties share the better rank)."""
    values = usefulness.to(torch.float64)
    if not rank_temperature:
        return floor + values
    ascending = torch.sort(values).values  # rank = 1 + how many values are strictly larger
    rank = 1 + len(values) - torch.searchsorted(ascending, values, right=True)
    return floor + (1.0 / rank.to(torch.float64)) ** (1.0 / rank_temperature)


class FeedbackCurriculumLoader(WeightedPromptLoader):
    """Batches drawn by usefulness: prompt ``i`` is drawn with weight ``floor + u_i``, where ``u_i`` is an
    exponential moving average (``decay``) of the feedback its rollouts got (1.0 before any: every
    prompt is tried before the curriculum narrows). Distinct prompts per batch while there are enough.

    With ``rank_temperature`` > 0 the weight is ``floor + (1 / rank_i) ** (1 / rank_temperature)``
    instead, ``rank_i`` the prompt's place by usefulness (1 = most useful; equal usefulness shares the
    better place): the rank prioritisation of Prioritized Level Replay (Jiang et al., 2021). Why: when
    most prompts' usefulness is low but not far apart, ``floor + u_i`` barely narrows the draws; ranks
    separate them by order, whatever the spread of the values.

    Why: in self-play a seed whose question groups keep missing the learnability band costs a
    proposal and ``rollout_n`` solver episodes per step and trains nothing; the seeds that last reached
    the band are where the proposer and solver both learn. ``floor`` keeps every prompt in play.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        *,
        seed: int,
        floor: float,
        decay: float,
        weights: torch.Tensor | None = None,
        rank_temperature: float = 0.0,
    ) -> None:
        base = torch.ones(len(examples)) if weights is None else weights
        super().__init__(examples, batch_size, seed=seed, weights=base)
        if floor <= 0 or not 0 <= decay < 1:
            raise ConfigError(f"curriculum floor must be > 0 and decay in [0, 1), got {floor} and {decay}")
        if rank_temperature < 0:
            raise ConfigError(
                f"curriculum rank temperature must be >= 0 (0: by value), got {rank_temperature}"
            )
        self.floor, self.decay, self.rank_temperature = floor, decay, rank_temperature
        self.usefulness = {e.prompt_id: 1.0 for e in self.examples}

    def weights(self) -> torch.Tensor:
        """``data.kind_weights`` x (floor + usefulness or its rank's score)."""
        values = torch.tensor([self.usefulness[e.prompt_id] for e in self.examples], dtype=torch.float64)
        return self.base_weights * curriculum_weights(values, self.floor, self.rank_temperature)

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
        PromptLoader.load_state_dict(self, state)
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
    """The loader ``cfg.data`` asks for: plain epochs, draws weighted by kind, or the feedback
    curriculum (weighted by kind too when ``data.kind_weights`` is set)."""
    kind_weights = dict(data_cfg.kind_weights or {})
    weights = kind_weight_vector(examples, kind_weights) if kind_weights else None
    if data_cfg.curriculum == "feedback":
        return FeedbackCurriculumLoader(
            examples,
            data_cfg.prompts_per_step,
            seed=seed,
            floor=data_cfg.curriculum_floor,
            decay=data_cfg.curriculum_decay,
            weights=weights,
            rank_temperature=data_cfg.curriculum_rank_temperature,
        )
    if weights is not None:
        return WeightedPromptLoader(examples, data_cfg.prompts_per_step, seed=seed, weights=weights)
    return PromptLoader(examples, data_cfg.prompts_per_step, shuffle=data_cfg.shuffle, seed=seed)
