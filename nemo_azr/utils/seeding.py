"""Seeding: one derived seed per (run seed, step), so a resumed run samples exactly like an unbroken one."""

from __future__ import annotations

import random

import numpy as np
import torch

_STEP_STRIDE = 1_000_003  # a prime, so (seed, step) pairs don't collide for realistic values


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    return (seed * _STEP_STRIDE + step * 7919 + salt) % (2**31 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
