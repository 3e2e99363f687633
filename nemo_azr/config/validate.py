"""Semantic checks of a composed config: everything a type check cannot see.

Each failure is a :class:`ConfigError` naming the key, the value and what would be valid, raised
before any model is loaded.
"""

from __future__ import annotations

from pathlib import Path

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")
KL_MODES = ("loss", "reward")


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _one_of(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    _require(value in allowed, f"{key}={value!r} is not one of: {', '.join(allowed)}")


def validate_config(cfg: NemoAzrConfig) -> None:
    # Importing these packages fills the registries the names below are checked against.
    import nemo_azr.algorithms  # noqa: F401
    import nemo_azr.models  # noqa: F401
    import nemo_azr.rollout  # noqa: F401
    import nemo_azr.tasks  # noqa: F401
    from nemo_azr.algorithms.aggregation import AGG_MODES
    from nemo_azr.algorithms.kl import KL_ESTIMATORS
    from nemo_azr.registry import (
        ADVANTAGE_ESTIMATORS,
        GENERATION_BACKENDS,
        POLICY_BACKENDS,
        POLICY_LOSSES,
        TASKS,
        WORKFLOWS,
    )

    alg, gen, opt, tr = cfg.algorithm, cfg.generation, cfg.optim, cfg.trainer
    for key, name, registry in (
        ("algorithm.estimator", alg.estimator, ADVANTAGE_ESTIMATORS),
        ("algorithm.loss", alg.loss, POLICY_LOSSES),
        ("model.backend", cfg.model.backend, POLICY_BACKENDS),
        ("generation.backend", gen.backend, GENERATION_BACKENDS),
        ("data.task", cfg.data.task, TASKS),
        ("rollout.workflow", cfg.rollout.workflow, WORKFLOWS),
    ):
        _require(name in registry, f"{key}={name!r} is unknown; known: {', '.join(registry.names())}")
    _one_of("algorithm.loss_agg_mode", alg.loss_agg_mode, AGG_MODES)
    _one_of("algorithm.kl.estimator", alg.kl.estimator, KL_ESTIMATORS)
    _one_of("algorithm.kl.mode", alg.kl.mode, KL_MODES)
    _one_of("model.dtype", cfg.model.dtype, DTYPES)
    _one_of("optim.schedule", opt.schedule, SCHEDULES)
    _one_of("trainer.device", tr.device, DEVICES)
    _one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)

    _require(gen.n_samples >= 1, f"generation.n_samples must be >= 1, got {gen.n_samples}")
    _require(gen.temperature > 0, f"generation.temperature must be > 0, got {gen.temperature}")
    _require(0 < gen.top_p <= 1, f"generation.top_p must be in (0, 1], got {gen.top_p}")
    _require(gen.top_k >= 0, f"generation.top_k must be >= 0, got {gen.top_k}")
    _require(gen.max_new_tokens >= 1, f"generation.max_new_tokens must be >= 1, got {gen.max_new_tokens}")
    if alg.estimator in ("grpo", "rloo"):
        _require(
            gen.n_samples >= 2,
            f"algorithm.estimator={alg.estimator} compares samples of one prompt, so it needs "
            f"generation.n_samples >= 2 (got {gen.n_samples}); or use reinforce_plus_plus",
        )

    _require(cfg.data.prompts_per_step >= 1, "data.prompts_per_step must be >= 1")
    if cfg.data.task == "jsonl":
        _require(bool(cfg.data.path), "data.task=jsonl needs data.path=/path/to/file.jsonl")
        _require(Path(cfg.data.path).is_file(), f"data.path={cfg.data.path!r}: no such file")
    rows = cfg.data.prompts_per_step * gen.n_samples
    _require(alg.ppo_epochs >= 1, f"algorithm.ppo_epochs must be >= 1, got {alg.ppo_epochs}")
    _require(
        alg.micro_batch_size >= 1, f"algorithm.micro_batch_size must be >= 1, got {alg.micro_batch_size}"
    )
    _require(alg.mini_batch_size >= 0, "algorithm.mini_batch_size must be >= 0 (0 = whole batch)")
    if alg.mini_batch_size:
        _require(
            rows % alg.mini_batch_size == 0,
            f"algorithm.mini_batch_size={alg.mini_batch_size} must divide the rows per step "
            f"(data.prompts_per_step x generation.n_samples = {rows})",
        )
    _require(alg.clip_ratio_low >= 0 and alg.clip_ratio_high >= 0, "algorithm.clip_ratio_* must be >= 0")
    if alg.dual_clip:
        _require(
            alg.clip_ratio_c > 1, f"algorithm.clip_ratio_c must be > 1 for dual-clip, got {alg.clip_ratio_c}"
        )
    _require(alg.eps >= 0 and alg.loss_eta >= 0, "algorithm.eps and algorithm.loss_eta must be >= 0")
    _require(0 < alg.gamma <= 1, f"algorithm.gamma must be in (0, 1], got {alg.gamma}")
    _require(alg.kl.coef >= 0, f"algorithm.kl.coef must be >= 0, got {alg.kl.coef}")
    _require(alg.norm_length >= 0, "algorithm.norm_length must be >= 0 (0 = generation.max_new_tokens)")
    _require(alg.entropy_coef >= 0, "algorithm.entropy_coef must be >= 0")

    _require(opt.lr > 0, f"optim.lr must be > 0, got {opt.lr}")
    _require(
        len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas),
        f"optim.betas must be two values in [0, 1), got {opt.betas}",
    )
    _require(opt.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 disables)")
    _require(opt.warmup_steps >= 0 and opt.total_steps >= 0, "optim.warmup_steps/total_steps must be >= 0")
    _require(0 <= opt.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1]")

    _require(tr.max_steps >= 0, f"trainer.max_steps must be >= 0, got {tr.max_steps}")
    _require(tr.save_interval >= 0 and tr.keep_last >= 0, "trainer.save_interval/keep_last must be >= 0")
    _require(bool(tr.output_dir), "trainer.output_dir must be set")
    _require(tr.max_skipped_steps >= 0, "trainer.max_skipped_steps must be >= 0")
    _require(cfg.model.logprob_chunk_size >= 0, "model.logprob_chunk_size must be >= 0 (0 = auto)")
    _require(
        cfg.sft_warmup.steps >= 0 and cfg.sft_warmup.batch_size >= 1, "sft_warmup.steps >= 0, batch_size >= 1"
    )
    _require(cfg.logger.console_interval >= 1, "logger.console_interval must be >= 1")
