"""The Bradley-Terry loss a reward model is trained with on preference pairs (Ouyang et al. 2022,
eq. 1): ``-log sigmoid(r(x, y_w) - r(x, y_l))`` averaged over pairs, and its accuracy, the share of
pairs whose chosen reply scores higher."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss"]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean ``-log sigmoid(chosen - rejected)``, share of pairs with ``chosen > rejected``) over pairs."""
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(
            f"Bradley-Terry loss: one score per pair each, got {tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    loss = -F.logsigmoid(chosen - rejected).mean()
    return loss, (chosen.detach() > rejected.detach()).float().mean()
