"""Preflight: the whole check of a composed config, above every component.

``config/`` composes the config and checks what needs no component; each component checks its own
keys beside it (``algorithms/config_check.py``, ``rlcr/config_check.py``, ``selfplay/config_check.py``,
``models/config_check.py``, ``rollout/trtllm_config_check.py``); this module imports the built-in
components once (``nemo_azr.plugins``), checks registered names and runs the checks that span
components. :func:`load_config` is what every entry point calls.
"""

from __future__ import annotations

from pathlib import Path

from nemo_azr.algorithms.config_check import (
    check_critic_config,
    check_dapo_config,
    check_off_policy_config,
    check_preference_config,
)
from nemo_azr.config.batch_shape import rows_per_step
from nemo_azr.config.checks import (
    DEVICES,
    DTYPES,
    WANDB_MODES,
    check_demonstrations,
    check_eval,
    check_optim,
    one_of,
    reject_nonfinite,
    require,
)
from nemo_azr.config.loader import DEFAULT_CONFIG_NAME, build_config
from nemo_azr.config.parallel_validate import (
    MEGATRON_MISSING,
    check_parallel_for_megatron,
    check_parallel_static,
    megatron_core_available,
)
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.models.config_check import check_throughput_config
from nemo_azr.registry import (
    ADVANTAGE_ESTIMATORS,
    GENERATION_BACKENDS,
    POLICY_BACKENDS,
    POLICY_LOSSES,
    TASKS,
    WORKFLOWS,
)
from nemo_azr.rewards.config_check import check_reward_model_config
from nemo_azr.rlcr.config_check import check_rlcr_config
from nemo_azr.rollout.trtllm_config_check import check_trtllm_config
from nemo_azr.selfplay.config_check import check_absolute_zero_config

KL_MODES = ("loss", "reward")
MEGATRON_BACKEND = "megatron"  # policy backend known by name before it registers (see validate_config)
GENERATED_TASKS = ("arithmetic", "synthetic_qa")  # built from the config alone (no files to read)


def load_config(
    overrides: list[str] | None = None, *, config_name: str = DEFAULT_CONFIG_NAME
) -> NemoAzrConfig:
    """Compose ``conf/`` with ``overrides``, convert to the dataclass tree and run every check.
    Raises ConfigError on any problem."""
    cfg = build_config(overrides, config_name=config_name)
    validate_config(cfg)
    return cfg


def validate_config(cfg: NemoAzrConfig) -> None:
    """Every check of ``cfg``: generic ones, registered names, each component's own keys, and the
    checks across components. Raises :class:`ConfigError` naming the key; runs before any model loads."""
    import nemo_azr.plugins  # noqa: F401  (fills the registries the names below are checked against)
    from nemo_azr.user_plugins import import_plugins

    import_plugins(list(cfg.plugins))  # the user's own components register themselves too
    from nemo_azr.algorithms.aggregation import AGG_MODES
    from nemo_azr.algorithms.kl import KL_ESTIMATORS
    from nemo_azr.kernels.backend import BACKENDS as KERNEL_BACKENDS

    alg, gen, opt, tr = cfg.algorithm, cfg.generation, cfg.optim, cfg.trainer
    reject_nonfinite(cfg)
    require(
        bool(cfg.model.path.strip()),
        "model.path is empty: set model.path=/path/to/hf_model_folder, a preset (smollm2-135m) or tiny",
    )
    megatron = cfg.model.backend == MEGATRON_BACKEND
    if megatron:
        require(megatron_core_available(), MEGATRON_MISSING)
    for key, name, registry in (
        ("algorithm.estimator", alg.estimator, ADVANTAGE_ESTIMATORS),
        ("algorithm.loss", alg.loss, POLICY_LOSSES),
        ("model.backend", cfg.model.backend, POLICY_BACKENDS),
        ("generation.backend", gen.backend, GENERATION_BACKENDS),
        ("data.task", cfg.data.task, TASKS),
        ("rollout.workflow", cfg.rollout.workflow, WORKFLOWS),
    ):
        # "megatron" registers only where megatron-core is installed (its absence failed above).
        known = registry.names() + ([MEGATRON_BACKEND] if registry is POLICY_BACKENDS else [])
        require(name in registry, f"{key}={name!r} is unknown; known: {', '.join(sorted(set(known)))}")
    require(
        gen.backend != "megatron" or megatron,
        "generation.backend=megatron samples from the megatron policy's own weights: it needs "
        "model.backend=megatron (or use generation.backend=hf)",
    )
    if gen.backend == "megatron":
        require(
            not cfg.parallel.sequence_parallel,
            "generation.backend=megatron does not support parallel.sequence_parallel=true (megatron's "
            "static batching decodes one token at a time, which cannot split over the TP ranks); use "
            "generation.backend=hf",
        )
        require(
            not cfg.parallel.virtual_pipeline_model_parallel_size,
            "generation.backend=megatron does not support virtual pipeline stages yet; use "
            "generation.backend=hf with parallel.virtual_pipeline_model_parallel_size > 0",
        )
    one_of("algorithm.loss_agg_mode", alg.loss_agg_mode, AGG_MODES)
    one_of("algorithm.kl.estimator", alg.kl.estimator, KL_ESTIMATORS)
    one_of("algorithm.kl.mode", alg.kl.mode, KL_MODES)
    one_of("algorithm.kl.reference", alg.kl.reference, ("initial", "warmup"))
    require(
        alg.kl.reference != "warmup" or cfg.sft_warmup.steps > 0,
        "algorithm.kl.reference=warmup needs a supervised warm-up (sft_warmup.steps > 0); without one use initial",
    )
    one_of("model.dtype", cfg.model.dtype, DTYPES)
    require(
        cfg.model.autocast_dtype in ("", "auto", *DTYPES[1:]),
        f"model.autocast_dtype={cfg.model.autocast_dtype!r} is not one of: '' (off), auto, {', '.join(DTYPES[1:])}",
    )
    require(
        cfg.generation.dtype in ("", "auto", *DTYPES),
        f"generation.dtype={cfg.generation.dtype!r} is not one of: '' (model.dtype), auto, {', '.join(DTYPES)}",
    )
    one_of("generation.decode", cfg.generation.decode, ("auto", "dynamic", "static"))
    require(
        cfg.generation.decode == "auto" or cfg.generation.backend in ("hf", "megatron"),
        f"generation.decode={cfg.generation.decode} is the hf and megatron backends' decode loop; "
        f"generation.backend={cfg.generation.backend} decodes its own way (leave generation.decode=auto)",
    )
    one_of("generation.decode_attention", cfg.generation.decode_attention, ("auto", "model", "grouped"))
    require(
        cfg.generation.decode_attention == "auto" or cfg.generation.backend == "hf",
        f"generation.decode_attention={cfg.generation.decode_attention} is the hf backend's static decode "
        f"step; generation.backend={cfg.generation.backend} decodes its own way",
    )
    one_of("data.curriculum", cfg.data.curriculum, ("none", "feedback"))
    require(
        cfg.data.curriculum_floor > 0 and 0 <= cfg.data.curriculum_decay < 1,
        f"data.curriculum_floor must be > 0 and data.curriculum_decay in [0, 1), got "
        f"{cfg.data.curriculum_floor} and {cfg.data.curriculum_decay}",
    )
    require(
        cfg.data.curriculum_rank_temperature >= 0,
        f"data.curriculum_rank_temperature must be >= 0 (0: weights by value), got "
        f"{cfg.data.curriculum_rank_temperature}",
    )
    require(
        not cfg.model.autocast_dtype or cfg.model.backend != MEGATRON_BACKEND,
        "model.autocast_dtype is the hf policy's mixed precision; megatron sets its precision through "
        "model.dtype (bf16 with fp32 master weights in its optimizer)",
    )
    require(
        not cfg.generation.dtype or gen.backend != "megatron",
        "generation.dtype applies to the hf generation backend's weight copy; generation.backend=megatron "
        "decodes on the policy's own weights (leave generation.dtype empty)",
    )
    if gen.backend == "trtllm":
        check_trtllm_config(cfg)
    one_of("trainer.device", tr.device, DEVICES)
    one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)

    require(gen.n_samples >= 1, f"generation.n_samples must be >= 1, got {gen.n_samples}")
    require(gen.temperature > 0, f"generation.temperature must be > 0, got {gen.temperature}")
    require(0 < gen.top_p <= 1, f"generation.top_p must be in (0, 1], got {gen.top_p}")
    require(gen.top_k >= 0, f"generation.top_k must be >= 0, got {gen.top_k}")
    require(gen.max_new_tokens >= 1, f"generation.max_new_tokens must be >= 1, got {gen.max_new_tokens}")
    least = ADVANTAGE_ESTIMATORS.get(alg.estimator).min_samples_per_prompt  # the estimator's own need
    if least > 1:
        require(
            gen.n_samples >= least,
            f"algorithm.estimator={alg.estimator} compares samples of one prompt, so it needs "
            f"generation.n_samples >= {least} (got {gen.n_samples}); or use reinforce_plus_plus",
        )

    require(cfg.data.prompts_per_step >= 1, "data.prompts_per_step must be >= 1")
    require(
        cfg.data.eval_size >= 0,
        f"data.eval_size must be >= 0 (0 = no held-out split), got {cfg.data.eval_size}",
    )
    check_demonstrations(cfg.data.demonstrations)
    if cfg.data.task in GENERATED_TASKS and not cfg.absolute_zero.enabled:
        from nemo_azr.tasks import build_task

        build_task(cfg.data)  # generated in memory, cheap: its config errors surface here (show-config too)
    if cfg.data.task == "jsonl":
        require(bool(cfg.data.path), "data.task=jsonl needs data.path=/path/to/file.jsonl")
        require(Path(cfg.data.path).is_file(), f"data.path={cfg.data.path!r}: no such file")
    rows, rows_desc = rows_per_step(cfg)
    require(alg.ppo_epochs >= 1, f"algorithm.ppo_epochs must be >= 1, got {alg.ppo_epochs}")
    require(alg.micro_batch_size >= 1, f"algorithm.micro_batch_size must be >= 1, got {alg.micro_batch_size}")
    require(alg.mini_batch_size >= 0, "algorithm.mini_batch_size must be >= 0 (0 = whole batch)")
    if alg.mini_batch_size and cfg.rollout.workflow != "azr":  # self-play batches vary in size
        require(
            rows % alg.mini_batch_size == 0,
            f"algorithm.mini_batch_size={alg.mini_batch_size} must divide the rows per step "
            f"({rows_desc} = {rows})",
        )
    require(alg.clip_ratio_low >= 0 and alg.clip_ratio_high >= 0, "algorithm.clip_ratio_* must be >= 0")
    if alg.dual_clip:
        require(
            alg.clip_ratio_c > 1, f"algorithm.clip_ratio_c must be > 1 for dual-clip, got {alg.clip_ratio_c}"
        )
    require(alg.eps >= 0 and alg.loss_eta >= 0, "algorithm.eps and algorithm.loss_eta must be >= 0")
    require(0 < alg.gamma <= 1, f"algorithm.gamma must be in (0, 1], got {alg.gamma}")
    require(alg.kl.coef >= 0, f"algorithm.kl.coef must be >= 0, got {alg.kl.coef}")
    require(alg.norm_length >= 0, "algorithm.norm_length must be >= 0 (0 = generation.max_new_tokens)")
    require(alg.entropy_coef >= 0, "algorithm.entropy_coef must be >= 0")

    check_optim("optim", opt)
    check_critic_config(cfg, rows, rows_desc)
    check_dapo_config(cfg)
    check_preference_config(cfg)
    check_reward_model_config(cfg)
    check_throughput_config(cfg, megatron)
    check_off_policy_config(cfg, megatron)

    require(tr.max_steps >= 0, f"trainer.max_steps must be >= 0, got {tr.max_steps}")
    require(tr.save_interval >= 0 and tr.keep_last >= 0, "trainer.save_interval/keep_last must be >= 0")
    require(bool(tr.output_dir), "trainer.output_dir must be set")
    require(tr.max_skipped_steps >= 0, "trainer.max_skipped_steps must be >= 0")
    require(
        not tr.async_save or megatron,
        "trainer.async_save=true needs model.backend=megatron (the hf backend saves synchronously)",
    )
    require(
        tr.max_steps_per_run >= 0,
        f"trainer.max_steps_per_run must be >= 0 (0: no limit), got {tr.max_steps_per_run}",
    )
    require(cfg.model.logprob_chunk_size >= 0, "model.logprob_chunk_size must be >= 0 (0 = auto)")
    one_of("model.kernel_backend", cfg.model.kernel_backend, KERNEL_BACKENDS)
    require(
        cfg.sft_warmup.steps >= 0 and cfg.sft_warmup.batch_size >= 1, "sft_warmup.steps >= 0, batch_size >= 1"
    )
    require(cfg.logger.console_interval >= 1, "logger.console_interval must be >= 1")
    check_parallel_static(cfg)  # every backend: a bad value fails at start even where unused
    if megatron:
        check_parallel_for_megatron(cfg)
    else:  # the hf backend shards nothing: a tp/pp layout would train silently unparallel
        tp, pp = cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size
        require(
            tp == 1 and pp == 1,
            f"parallel.tensor_model_parallel_size={tp} x pipeline_model_parallel_size={pp} needs model=megatron "
            f"(model.backend={cfg.model.backend!r} runs the whole model in each process); add model=megatron "
            "and start it with torchrun (docs/megatron.md), or drop the parallel= override",
        )
    check_eval(cfg.eval)
    check_absolute_zero_config(cfg)
    if cfg.rollout.workflow in ("rlcr", "rlcr_two_turn", "rlcr_single_turn"):
        check_rlcr_config(cfg)
    else:
        require(
            alg.estimator != "rlcr_hierarchical",
            "algorithm.estimator=rlcr_hierarchical needs rollout.workflow=rlcr_two_turn (answer and "
            "confidence rows with subgroup ids)",
        )
