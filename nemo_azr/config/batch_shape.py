"""How many rows one training step's batch has, from the config alone (the generic check and the
parallel layout's batch checks both need it; a module below both, so neither imports the other)."""

from __future__ import annotations

from nemo_azr.config.schema import NemoAzrConfig


def rows_per_step(cfg: NemoAzrConfig) -> tuple[int, str]:
    """Rows of one step's batch and how they are counted (RLCR two-turn: G_a answers + G_a x G_c confidences, or
    the enumerated candidates, after each analysis with rlcr.analyses_per_answer)."""
    r = cfg.rlcr
    if cfg.rollout.workflow == "rlcr_two_turn" or (cfg.rollout.workflow == "rlcr" and r.multi_turn):
        if r.confidence_decoding == "enumerate":  # a row per candidate (after each analysis)
            per_answer = len(r.confidence_candidates)
            how = "G_a x (1 + candidates)"
            if r.analyses_per_answer > 0:
                per_answer = r.analyses_per_answer * (1 + per_answer)
                how = "G_a x (1 + analyses x (1 + candidates))"
        else:
            per_answer, how = r.num_generations_confidence, "G_a x (1 + G_c)"
        per_prompt = r.num_generations_answer * (1 + per_answer)
        return cfg.data.prompts_per_step * per_prompt, f"data.prompts_per_step x {how}"
    return (
        cfg.data.prompts_per_step * cfg.generation.n_samples,
        "data.prompts_per_step x generation.n_samples",
    )
