"""What the trainer, the generation backends and checkpoints need of a policy backend and of a critic
(``hf``, ``megatron``): one interface behind each, so nothing probes for what a backend has."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from nemo_azr.contracts.update import UpdateContext


@runtime_checkable
class Policy(Protocol):
    hf_config: Any  # the transformers config of the model (megatron keeps the HF one it was built from)

    def setup_optimizer(self, total_steps: int) -> None: ...

    def update_schedule(self) -> tuple[int, int, bool]: ...  # (ppo epochs, mini-batch rows, shuffle)

    def compute_logprobs(self, batch: Any) -> torch.Tensor: ...

    def update(self, batch: Any, ctx: UpdateContext) -> dict[str, float]: ...

    def save(self, folder: Path, *, tokenizer: Any = None) -> None: ...

    def load(self, folder: Path) -> None: ...

    def generation_model(self) -> torch.nn.Module: ...  # the HF-layout module a generation backend copies

    def export_hf_state_dict(self) -> dict[str, torch.Tensor]: ...  # HF-layout weights for a refit


@runtime_checkable
class Critic(Protocol):
    """PPO's value model (``hf``, the policy's shared trunk, or ``megatron``)."""

    def setup_optimizer(self, total_steps: int) -> None: ...

    def update_schedule(self) -> tuple[int, int, bool]: ...

    def compute_values(self, batch: Any) -> torch.Tensor: ...  # rollout-time values [B, T]

    def update(self, batch: Any, ctx: UpdateContext) -> dict[str, float]: ...

    def save(self, folder: Path) -> None: ...

    def load(self, folder: Path) -> None: ...
