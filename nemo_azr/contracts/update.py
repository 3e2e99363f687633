"""What one update of a policy or a critic needs besides its batch (seed 004 §3.5, ``UpdateContext``).

The trainer builds one per model per step and hands it over whole, so the runner does not scatter the
update's details (the length normaliser, the shuffling seed) over its calls. The model's own schedule
(PPO epochs, mini-batch rows, shuffle) stays with the model: the critic has its own
(``critic.ppo_epochs``), and the batch carries the advantages and log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nemo_azr.utils.seeding import step_seed

POLICY_SHUFFLE_SALT = 1  # the policy's and the critic's mini-batch orders differ within a step
CRITIC_SHUFFLE_SALT = 2


@dataclass(frozen=True)
class UpdateContext:
    """``norm_length``: the constant of ``seq-mean-token-sum-norm`` (the run's longest sequence
    budget); ``generator``: the mini-batch shuffle's random stream (``None``: torch's global one)."""

    norm_length: int
    generator: torch.Generator | None = field(default=None, compare=False)
    step: int = 0

    @classmethod
    def for_step(cls, *, seed: int, step: int, salt: int, norm_length: int) -> UpdateContext:
        """The context of ``step``: its shuffle stream depends on (seed, step, salt) only, so a
        resumed run shuffles its mini-batches exactly as the uninterrupted one."""
        generator = torch.Generator().manual_seed(step_seed(seed, step, salt=salt))
        return cls(norm_length=norm_length, generator=generator, step=step)
