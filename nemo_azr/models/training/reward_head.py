"""What the hf and megatron reward-model trainers share (``nemo-azr train-rm``): the score head's
first weights and the optimizer settings, so the two backends start from the same model and step it
the same way."""

from __future__ import annotations

import dataclasses

import torch

from nemo_azr.config.schema import NemoAzrConfig, OptimConfig

__all__ = ["init_score_head_", "reward_model_optim"]


def init_score_head_(weight: torch.Tensor, std: float, seed: int) -> None:
    """Draw the one-label head ``[1, H]`` from ``N(0, std)`` (transformers' init of a ``score`` head,
    ``std`` = the config's ``initializer_range``) with its own generator seeded by ``seed``: the same
    values on every backend and every tensor-parallel rank, whatever the global RNG has drawn before."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(weight.shape, generator=gen, dtype=torch.float32) * std
    with torch.no_grad():
        weight.copy_(values.to(dtype=weight.dtype, device=weight.device))


def reward_model_optim(cfg: NemoAzrConfig) -> OptimConfig:
    """AdamW at ``reward_model.train_lr``, no weight decay, a constant rate, ``optim``'s betas and eps,
    gradients clipped at ``optim.grad_clip`` (1.0 when that is 0)."""
    return dataclasses.replace(
        cfg.optim,
        lr=cfg.reward_model.train_lr,
        weight_decay=0.0,
        grad_clip=cfg.optim.grad_clip or 1.0,
        warmup_steps=0,
        schedule="constant",
        total_steps=0,
    )
