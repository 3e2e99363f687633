"""Reference tasks for the proposer: the most recent questions that reached the learnability band.

Absolute Zero (Zhao et al., 2025) conditions each proposal on K tasks drawn from a buffer of earlier
valid ones. Here the buffer keeps the questions whose solver results were mixed (learnable), newest
last, so the references follow the solver: a temptation it now always resists drops out of the
buffer as newer in-band questions arrive. The seeds leave the proposer prompt open (decision 180).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any


class ReferenceBuffer:
    """Up to ``capacity`` task configs, first in first out, no duplicates (a question proposed again
    moves to the newest end)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[dict[str, Any]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _key(config: dict[str, Any]) -> str:
        return json.dumps(config, sort_keys=True)

    def add(self, configs: Iterable[dict[str, Any]]) -> None:
        for config in configs:
            key = self._key(config)
            kept = [c for c in self._items if self._key(c) != key]
            self._items = deque(kept)
            self._items.append(dict(config))
            while len(self._items) > self.capacity:
                self._items.popleft()

    def sample(self, k: int, rng: random.Random) -> list[dict[str, Any]]:
        """``k`` distinct references (fewer while the buffer holds fewer), in buffer order."""
        if k <= 0 or not self._items:
            return []
        picked = sorted(rng.sample(range(len(self._items)), min(k, len(self._items))))
        return [dict(self._items[i]) for i in picked]

    def state_dict(self) -> dict[str, Any]:
        return {"items": [dict(c) for c in self._items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._items = deque()
        self.add(state.get("items", []))


def learnable_questions(
    questions: Sequence[dict[str, Any]], learnable: Sequence[bool]
) -> list[dict[str, Any]]:
    """The questions of one group that reached the band."""
    return [q for q, ok in zip(questions, learnable) if ok]
