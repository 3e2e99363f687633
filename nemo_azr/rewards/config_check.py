"""``reward_model.*`` checks (seed 004 class 4), run by ``nemo_azr.preflight``."""

from __future__ import annotations

from pathlib import Path

import torch

from nemo_azr.config.checks import one_of, require
from nemo_azr.config.schema import NemoAzrConfig

__all__ = ["check_reward_model_config"]


def check_reward_model_config(cfg: NemoAzrConfig) -> None:
    """The training keys always (``nemo-azr train-rm`` reads them); the scoring ones when ``path`` is set."""
    rm = cfg.reward_model
    require(rm.train_steps >= 1, f"reward_model.train_steps must be >= 1, got {rm.train_steps}")
    require(
        rm.train_pairs_per_step >= 1,
        f"reward_model.train_pairs_per_step must be >= 1, got {rm.train_pairs_per_step}",
    )
    require(rm.train_lr > 0, f"reward_model.train_lr must be > 0, got {rm.train_lr}")
    require(rm.heldout_pairs >= 1, f"reward_model.heldout_pairs must be >= 1, got {rm.heldout_pairs}")
    require(rm.eval_every >= 1, f"reward_model.eval_every must be >= 1, got {rm.eval_every}")
    require(rm.batch_size >= 1, f"reward_model.batch_size must be >= 1, got {rm.batch_size}")
    one_of("reward_model.dtype", rm.dtype, ("float32", "bfloat16", "float16"))
    one_of("reward_model.placement", rm.placement, ("trainer", "process"))
    require(rm.num_threads >= 0, f"reward_model.num_threads must be >= 0, got {rm.num_threads}")
    require(
        not rm.device or rm.device == "cpu" or rm.device.startswith("cuda"),
        f"reward_model.device={rm.device!r}: give cpu, cuda or cuda:N (or '' for the trainer's device)",
    )
    require(
        not rm.device.startswith("cuda") or torch.cuda.is_available(),
        f"reward_model.device={rm.device}: this machine has no CUDA device",
    )
    if not rm.path:
        return
    require(
        (Path(rm.path).expanduser() / "config.json").is_file(),
        f"reward_model.path={rm.path!r}: no model folder (config.json) there; `nemo-azr train-rm` writes one",
    )
    require(
        rm.weight >= 0 and rm.rule_weight >= 0 and rm.weight + rm.rule_weight > 0,
        f"reward_model.weight and rule_weight must be >= 0 and not both 0, got {rm.weight} and {rm.rule_weight}",
    )
    require(
        cfg.rollout.workflow == "single_turn" and not cfg.absolute_zero.enabled,
        f"reward_model.path scores single-turn replies: rollout.workflow={cfg.rollout.workflow} scores its own "
        "turns (set rollout.workflow=single_turn, or reward_model.path='')",
    )
    require(
        not cfg.preference.loss,
        f"reward_model.path scores rollouts; preference.loss={cfg.preference.loss} trains on pairs without any",
    )
