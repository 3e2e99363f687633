"""Defaults of the generation engine lifecycle (``contracts.generation.GenerationBackend``): a
backend overrides what it does differently, and every backend answers every call."""

from __future__ import annotations

from typing import Any


class GenerationEngineBase:
    """No-op lifecycle: nothing to release, flush or shut down, no refit metrics, weights copied."""

    reads_policy_in_place = False

    def __init__(self) -> None:
        self.version = 0
        self.refit_metrics: dict[str, float] = {}

    def sync_weights(self, policy: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot load new weights")

    def release(self) -> None:
        """The rollout is done; nothing to free between steps."""

    def flush_cache(self) -> None:
        """No cache outlives a request."""

    def shutdown(self) -> None:
        """Nothing to stop."""
