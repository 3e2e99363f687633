"""What the trainer needs of an advantage estimator: a callable with its requirements attached.

Registered estimators (``algorithms.advantages.advantage_estimator``) and the per-role split
(``algorithms.per_role.role_split_estimator``) both satisfy :class:`AdvantageEstimator`; the
trainer reads ``required_keys`` to check the batch before the update and builds a critic when
``values`` is among them, and rolls out a greedy baseline when ``needs_greedy_baseline``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class AdvantageEstimator(Protocol):
    required_keys: tuple[str, ...]  # batch tensors beyond rewards / loss_mask
    required_meta: tuple[str, ...]  # per-row meta (group_id for group baselines)
    needs_greedy_baseline: bool  # the rollout also decodes one greedy sample per prompt
    min_samples_per_prompt: int  # the least generation.n_samples it works with

    def __call__(self, batch: Any, cfg: Any) -> tuple[torch.Tensor, torch.Tensor | None]: ...
