"""Defaults of the generation engine lifecycle (``contracts.generation.GenerationBackend``): a
backend overrides what it does differently, and every backend answers every call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, Sample, SamplingParams


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

    def generate_in_chunks(
        self,
        requests: list[GenerationRequest],
        sampling: SamplingParams,
        decode: Callable[[list[list[int]], SamplingParams], list[Sample]],
        max_batch_size: int = 0,
    ) -> list[GenerationOutput]:
        """The backends' own decode loops share this: each request repeated ``sampling.n`` times,
        decoded ``max_batch_size`` rows at a time (0: all at once) by ``decode(prompt_ids, sampling)``,
        and regrouped per request in order."""
        flat = [r for r in requests for _ in range(sampling.n)]
        step = max_batch_size or len(flat)
        samples: list[Sample] = []
        for start in range(0, len(flat), step):
            samples.extend(decode([r.prompt_ids for r in flat[start : start + step]], sampling))
        return [
            GenerationOutput(
                request=req,
                samples=samples[i * sampling.n : (i + 1) * sampling.n],
                policy_version=self.version,
            )
            for i, req in enumerate(requests)
        ]
