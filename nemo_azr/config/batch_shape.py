"""How many rows one training step's batch has, from the config alone (the generic check and the
parallel layout's batch checks both need it; a module below both, so neither imports the other)."""

from __future__ import annotations

from nemo_azr.config.schema import NemoAzrConfig


def rows_per_step(cfg: NemoAzrConfig) -> tuple[int, str]:
    """Rows of one step's batch and how they are counted (RLCR two-turn: G_a answers + G_a x G_c confidences)."""
    r = cfg.rlcr
    if cfg.rollout.workflow == "rlcr_two_turn" or (cfg.rollout.workflow == "rlcr" and r.multi_turn):
        per_prompt = r.num_generations_answer * (1 + r.num_generations_confidence)
        return cfg.data.prompts_per_step * per_prompt, "data.prompts_per_step x G_a x (1 + G_c)"
    return (
        cfg.data.prompts_per_step * cfg.generation.n_samples,
        "data.prompts_per_step x generation.n_samples",
    )
