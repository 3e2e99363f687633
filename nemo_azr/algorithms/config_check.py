"""Config checks of the RL algorithm keys that need the algorithms package to judge: the critic, DAPO,
off-policy correction and direct preference optimisation (``nemo_azr.preflight`` runs them)."""

from __future__ import annotations

import math
from pathlib import Path

from nemo_azr.config.checks import check_optim, one_of, require
from nemo_azr.config.schema import NemoAzrConfig

ASYNC_GENERATIONS = ("auto", "thread", "process")  # rollout.async_generation


def check_critic_config(cfg: NemoAzrConfig, rows: int, rows_desc: str) -> None:
    """``critic.*`` is checked whatever the estimator (a bad value fails at start even where unused)."""
    from nemo_azr.algorithms.aggregation import AGG_MODES

    c = cfg.critic
    check_optim("critic.optim", c.optim)
    one_of("critic.loss_agg_mode", c.loss_agg_mode, AGG_MODES)
    require(
        c.cliprange_value >= 0, f"critic.cliprange_value must be >= 0 (0: no clip), got {c.cliprange_value}"
    )
    for key in ("warmup_steps", "ppo_epochs", "mini_batch_size", "micro_batch_size"):
        require(getattr(c, key) >= 0, f"critic.{key} must be >= 0 (0: the default), got {getattr(c, key)}")
    if c.mini_batch_size and cfg.rollout.workflow != "azr":
        require(
            rows % c.mini_batch_size == 0,
            f"critic.mini_batch_size={c.mini_batch_size} must divide the rows per step ({rows_desc} = {rows})",
        )
    if c.shared_trunk:
        require(
            cfg.model.backend == "hf",
            "critic.shared_trunk=true puts the value head on the hf policy's trunk; with model.backend=megatron "
            "the critic is a separate model (critic.shared_trunk=false)",
        )
        require(
            c.warmup_steps == 0,
            "critic.warmup_steps trains the critic alone, which a shared trunk cannot (one joint loss): set it to 0",
        )
        require(c.value_loss_coef > 0, f"critic.value_loss_coef must be > 0, got {c.value_loss_coef}")
    alg = cfg.algorithm
    require(0 <= alg.gae_lambda <= 1, f"algorithm.gae_lambda must be in [0, 1], got {alg.gae_lambda}")


def check_dapo_config(cfg: NemoAzrConfig) -> None:
    alg = cfg.algorithm
    require(
        alg.estimator != "trr_plus_plus" or cfg.rollout.workflow == "azr",
        "algorithm.estimator=trr_plus_plus normalises per task type x role, which self-play rows carry "
        "(rollout.workflow=azr); for other tasks use grpo",
    )
    require(
        alg.max_sampling_rounds >= 1,
        f"algorithm.max_sampling_rounds must be >= 1, got {alg.max_sampling_rounds}",
    )
    if alg.dynamic_sampling:
        require(
            cfg.rollout.workflow != "azr",
            "algorithm.dynamic_sampling does not apply to self-play: its learnability filter already "
            "keeps the groups that teach and re-proposes the others (absolute_zero.max_repropose_attempts)",
        )
        require(
            alg.estimator != "remax",
            "algorithm.dynamic_sampling with estimator=remax: the greedy baseline is rolled out for the "
            "first draw of prompts only; use grpo or rloo",
        )
    require(
        0 <= alg.overlong_buffer_frac < 1,
        f"algorithm.overlong_buffer_frac must be in [0, 1) (0: off), got {alg.overlong_buffer_frac}",
    )
    if alg.overlong_buffer_frac:
        require(alg.overlong_penalty_factor >= 0, "algorithm.overlong_penalty_factor must be >= 0")


def check_off_policy_config(cfg: NemoAzrConfig, megatron: bool) -> None:
    """Off-policy correction and asynchronous rollout (docs/throughput.md)."""
    from nemo_azr.algorithms.off_policy import IS_LEVELS, OFF_POLICY_CORRECTIONS

    alg, ro = cfg.algorithm, cfg.rollout
    one_of("algorithm.off_policy_correction", alg.off_policy_correction, OFF_POLICY_CORRECTIONS)
    one_of("algorithm.is_level", alg.is_level, IS_LEVELS)
    require(
        math.isfinite(alg.is_cap) and alg.is_cap >= 1.0,
        f"algorithm.is_cap must be a finite number >= 1 (an on-policy token has weight 1), got {alg.is_cap}",
    )
    require(
        not (alg.use_rollout_logprobs and alg.off_policy_correction != "none"),
        "algorithm.off_policy_correction weighs pi_old / pi_rollout, which is 1 when "
        "algorithm.use_rollout_logprobs=true makes pi_old the rollout's: use one of them",
    )
    require(ro.max_policy_lag >= 0, f"rollout.max_policy_lag must be >= 0, got {ro.max_policy_lag}")
    require(
        ro.async_threads >= 0,
        f"rollout.async_threads must be >= 0 (0: the trainer's), got {ro.async_threads}",
    )
    one_of("rollout.async_generation", ro.async_generation, ASYNC_GENERATIONS)
    if not ro.async_rollout:
        return
    require(
        not megatron and cfg.generation.backend == "hf",
        "rollout.async_rollout=true needs model.backend=hf and generation.backend=hf (a generation "
        "backend with its own copy of the weights, loaded between rollouts)",
    )
    require(
        ro.workflow != "azr",
        "rollout.async_rollout=true is not available for self-play (rollout.workflow=azr): its task "
        "buffers are updated by the training steps the rollout would run ahead of",
    )


def check_preference_config(cfg: NemoAzrConfig) -> None:
    """``preference.*``: a known loss, and a run that has no rollout for it to replace oddly."""
    from nemo_azr.algorithms.preference import PAIRED_LOSSES

    pref = cfg.preference
    if not pref.loss:
        return
    require(
        pref.loss in (*PAIRED_LOSSES, "kto"),
        f"preference.loss={pref.loss!r} is not one of: '' (off), {', '.join(PAIRED_LOSSES)}, kto",
    )
    require(pref.beta > 0, f"preference.beta must be > 0, got {pref.beta}")
    require(
        pref.desirable_weight > 0 and pref.undesirable_weight > 0,
        f"preference.desirable_weight and undesirable_weight must be > 0, got "
        f"{pref.desirable_weight} and {pref.undesirable_weight}",
    )
    require(
        pref.loss == "kto" or (pref.desirable_weight == 1.0 and pref.undesirable_weight == 1.0),
        f"preference.desirable_weight / undesirable_weight are KTO's; preference.loss={pref.loss} has "
        "none (leave them at 1.0)",
    )
    require(
        pref.loss != "kto" or cfg.data.prompts_per_step >= 2,
        "preference.loss=kto estimates its reference point from other pairs' responses in the step: "
        f"data.prompts_per_step must be >= 2, got {cfg.data.prompts_per_step}",
    )
    one_of("preference.pair_style", pref.pair_style, ("bare", "equation"))
    require(
        pref.nll_weight >= 0 and (pref.nll_weight == 0 or pref.loss in ("dpo", "ipo")),
        f"preference.nll_weight (RPO's NLL on the chosen reply) must be >= 0 and needs pairs (dpo, ipo); "
        f"got {pref.nll_weight} with preference.loss={pref.loss}",
    )
    require(
        0 <= pref.label_smoothing < 0.5,
        f"preference.label_smoothing must be in [0, 0.5), got {pref.label_smoothing}",
    )
    require(
        pref.label_smoothing == 0 or pref.loss == "dpo",
        f"preference.label_smoothing is conservative DPO's; preference.loss={pref.loss} has none (set 0)",
    )
    require(
        not pref.pairs_path or Path(pref.pairs_path).expanduser().is_file(),
        f"preference.pairs_path={pref.pairs_path!r}: no such file (`nemo-azr sample-pairs` with the same "
        "overrides writes the policy's own pairs to preference.sample_out, by default "
        "<trainer.output_dir>/sampled_pairs.jsonl)",
    )
    require(
        not pref.unpaired_path or pref.loss == "kto",
        f"preference.unpaired_path holds unpaired examples, which only kto trains on (preference.loss={pref.loss} "
        "needs pairs: preference.pairs_path)",
    )
    require(
        not (pref.unpaired_path and pref.pairs_path),
        "preference.pairs_path and preference.unpaired_path are both set; give one",
    )
    require(
        not pref.unpaired_path or Path(pref.unpaired_path).expanduser().is_file(),
        f"preference.unpaired_path={pref.unpaired_path!r}: no such file",
    )
    require(
        bool(pref.pairs_path or pref.unpaired_path) or cfg.data.task == "arithmetic",
        f"preference.loss={pref.loss} needs pairs: preference.pairs_path=FILE.jsonl, or data.task="
        f"arithmetic (right answer against a near miss); data.task={cfg.data.task} has no generator",
    )
    for on, key in (
        (cfg.absolute_zero.enabled, "absolute_zero.enabled"),
        (cfg.rollout.async_rollout, "rollout.async_rollout"),
        (cfg.algorithm.dynamic_sampling, "algorithm.dynamic_sampling"),
    ):
        require(not on, f"preference.loss={pref.loss} trains on pairs, with no rollout: set {key}=false")
    paired_on_megatron = cfg.model.backend == "megatron" and pref.loss in PAIRED_LOSSES
    require(
        not paired_on_megatron or cfg.parallel.micro_batch_size % 2 == 0,
        f"preference.loss={pref.loss} on megatron: parallel.micro_batch_size={cfg.parallel.micro_batch_size} must "
        "be even (a pair's two rows go into one micro-batch)",
    )
    require(
        not paired_on_megatron or cfg.algorithm.max_tokens_per_microbatch == 0,
        f"preference.loss={pref.loss} on megatron: algorithm.max_tokens_per_microbatch must be 0 (token-budget "
        "micro-batches would split pairs)",
    )
