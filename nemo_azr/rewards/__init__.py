"""Reward functions (importing registers them)."""

from nemo_azr.rewards import accuracy  # noqa: F401
