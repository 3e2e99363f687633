"""nemo_azr: reinforcement-learning trainer for LLMs (Absolute Zero self-play, RLCR, GRPO/PPO)."""

__version__ = "0.1.0"
