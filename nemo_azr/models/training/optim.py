"""AdamW + LR schedule (linear warm-up, then constant / linear / cosine decay to a floor)."""

from __future__ import annotations

import math

import torch

from nemo_azr.config.schema import OptimConfig


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the base LR at optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        decay = 1.0 - progress
    else:  # cosine
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_optimizer(
    params, cfg: OptimConfig, *, total_steps: int, lr: float | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    opt = torch.optim.AdamW(
        [p for p in params if p.requires_grad],
        lr=cfg.lr if lr is None else lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )
    return opt, lr_schedule(opt, cfg, total_steps=total_steps)


def lr_schedule(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, *, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``optim``'s LR schedule over ``optimizer`` (warm-up, then constant / linear / cosine)."""
    horizon = cfg.total_steps or total_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(
            s,
            warmup_steps=cfg.warmup_steps,
            total_steps=horizon,
            schedule=cfg.schedule,
            min_lr_ratio=cfg.min_lr_ratio,
        ),
    )
