"""Semantic checks of a composed config: everything a type check cannot see.

Each failure is a :class:`ConfigError` naming the key, the value and what would be valid, raised
before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from nemo_azr.config.batch_shape import rows_per_step
from nemo_azr.config.parallel_validate import (
    MEGATRON_MISSING,
    check_parallel_for_megatron,
    check_parallel_static,
    megatron_core_available,
)
from nemo_azr.config.schema import NemoAzrConfig, OptimConfig
from nemo_azr.errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")
KL_MODES = ("loss", "reward")
MEGATRON_BACKEND = "megatron"  # policy backend known by name before it registers (see validate_config)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _one_of(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    _require(value in allowed, f"{key}={value!r} is not one of: {', '.join(allowed)}")


def _reject_nonfinite(node: object, prefix: str = "") -> None:
    """No numeric setting may be inf/nan: ``optim.lr=inf`` passes a ``> 0`` check and would turn every
    weight into nan at the first step. (``extra`` is the user's own and is not checked.)"""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _reject_nonfinite(value, f"{key}.")
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            _require(not isinstance(v, float) or math.isfinite(v), f"{key}={value} is not a finite number")


def validate_config(cfg: NemoAzrConfig) -> None:
    # Importing these packages fills the registries the names below are checked against.
    import nemo_azr.algorithms  # noqa: F401
    import nemo_azr.models  # noqa: F401
    import nemo_azr.rlcr  # noqa: F401
    import nemo_azr.rollout  # noqa: F401
    import nemo_azr.selfplay  # noqa: F401  (the azr workflow)
    import nemo_azr.tasks  # noqa: F401
    from nemo_azr.algorithms.aggregation import AGG_MODES
    from nemo_azr.algorithms.kl import KL_ESTIMATORS
    from nemo_azr.kernels.backend import BACKENDS as KERNEL_BACKENDS
    from nemo_azr.registry import (
        ADVANTAGE_ESTIMATORS,
        GENERATION_BACKENDS,
        POLICY_BACKENDS,
        POLICY_LOSSES,
        TASKS,
        WORKFLOWS,
    )

    alg, gen, opt, tr = cfg.algorithm, cfg.generation, cfg.optim, cfg.trainer
    _reject_nonfinite(cfg)
    _require(
        bool(cfg.model.path.strip()),
        "model.path is empty: set model.path=/path/to/hf_model_folder, a preset (smollm2-135m) or tiny",
    )
    megatron = cfg.model.backend == MEGATRON_BACKEND
    if megatron:
        _require(megatron_core_available(), MEGATRON_MISSING)
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
        _require(name in registry, f"{key}={name!r} is unknown; known: {', '.join(sorted(set(known)))}")
    _require(
        gen.backend != "megatron" or megatron,
        "generation.backend=megatron samples from the megatron policy's own weights: it needs "
        "model.backend=megatron (or use generation.backend=hf)",
    )
    if gen.backend == "megatron":
        _require(
            not cfg.parallel.sequence_parallel,
            "generation.backend=megatron does not support parallel.sequence_parallel=true (megatron's "
            "static batching decodes one token at a time, which cannot split over the TP ranks); use "
            "generation.backend=hf",
        )
        _require(
            not cfg.parallel.virtual_pipeline_model_parallel_size,
            "generation.backend=megatron does not support virtual pipeline stages yet; use "
            "generation.backend=hf with parallel.virtual_pipeline_model_parallel_size > 0",
        )
    _one_of("algorithm.loss_agg_mode", alg.loss_agg_mode, AGG_MODES)
    _one_of("algorithm.kl.estimator", alg.kl.estimator, KL_ESTIMATORS)
    _one_of("algorithm.kl.mode", alg.kl.mode, KL_MODES)
    _one_of("algorithm.kl.reference", alg.kl.reference, ("initial", "warmup"))
    _require(
        alg.kl.reference != "warmup" or cfg.sft_warmup.steps > 0,
        "algorithm.kl.reference=warmup needs a supervised warm-up (sft_warmup.steps > 0); without one use initial",
    )
    _one_of("model.dtype", cfg.model.dtype, DTYPES)
    _require(
        cfg.model.autocast_dtype in ("", *DTYPES[1:]),
        f"model.autocast_dtype={cfg.model.autocast_dtype!r} is not one of: '' (off), {', '.join(DTYPES[1:])}",
    )
    _require(
        cfg.generation.dtype in ("", *DTYPES),
        f"generation.dtype={cfg.generation.dtype!r} is not one of: '' (model.dtype), {', '.join(DTYPES)}",
    )
    _one_of("generation.decode", cfg.generation.decode, ("auto", "dynamic", "static"))
    _require(
        cfg.generation.decode == "auto" or cfg.generation.backend == "hf",
        f"generation.decode={cfg.generation.decode} is the hf backend's decode loop; generation.backend="
        f"{cfg.generation.backend} decodes its own way (leave generation.decode=auto)",
    )
    _one_of("data.curriculum", cfg.data.curriculum, ("none", "feedback"))
    _require(
        cfg.data.curriculum_floor > 0 and 0 <= cfg.data.curriculum_decay < 1,
        f"data.curriculum_floor must be > 0 and data.curriculum_decay in [0, 1), got "
        f"{cfg.data.curriculum_floor} and {cfg.data.curriculum_decay}",
    )
    _require(
        not cfg.model.autocast_dtype or cfg.model.backend != MEGATRON_BACKEND,
        "model.autocast_dtype is the hf policy's mixed precision; megatron sets its precision through "
        "model.dtype (bf16 with fp32 master weights in its optimizer)",
    )
    _require(
        not cfg.generation.dtype or gen.backend != "megatron",
        "generation.dtype applies to the hf generation backend's weight copy; generation.backend=megatron "
        "decodes on the policy's own weights (leave generation.dtype empty)",
    )
    if gen.backend == "trtllm":
        _check_trtllm(cfg)
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
    _require(
        cfg.data.eval_size >= 0,
        f"data.eval_size must be >= 0 (0 = no held-out split), got {cfg.data.eval_size}",
    )
    _validate_demonstrations(cfg.data.demonstrations)
    if cfg.data.task in GENERATED_TASKS and not cfg.absolute_zero.enabled:
        from nemo_azr.tasks import build_task

        build_task(cfg.data)  # generated in memory, cheap: its config errors surface here (show-config too)
    if cfg.data.task == "jsonl":
        _require(bool(cfg.data.path), "data.task=jsonl needs data.path=/path/to/file.jsonl")
        _require(Path(cfg.data.path).is_file(), f"data.path={cfg.data.path!r}: no such file")
    rows, rows_desc = rows_per_step(cfg)
    _require(alg.ppo_epochs >= 1, f"algorithm.ppo_epochs must be >= 1, got {alg.ppo_epochs}")
    _require(
        alg.micro_batch_size >= 1, f"algorithm.micro_batch_size must be >= 1, got {alg.micro_batch_size}"
    )
    _require(alg.mini_batch_size >= 0, "algorithm.mini_batch_size must be >= 0 (0 = whole batch)")
    if alg.mini_batch_size and cfg.rollout.workflow != "azr":  # self-play batches vary in size
        _require(
            rows % alg.mini_batch_size == 0,
            f"algorithm.mini_batch_size={alg.mini_batch_size} must divide the rows per step "
            f"({rows_desc} = {rows})",
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

    _validate_optim("optim", opt)
    _validate_critic(cfg, rows, rows_desc)
    _validate_dapo(cfg)
    _validate_throughput(cfg, megatron)
    _validate_off_policy(cfg, megatron)

    _require(tr.max_steps >= 0, f"trainer.max_steps must be >= 0, got {tr.max_steps}")
    _require(tr.save_interval >= 0 and tr.keep_last >= 0, "trainer.save_interval/keep_last must be >= 0")
    _require(bool(tr.output_dir), "trainer.output_dir must be set")
    _require(tr.max_skipped_steps >= 0, "trainer.max_skipped_steps must be >= 0")
    _require(
        not tr.async_save or megatron,
        "trainer.async_save=true needs model.backend=megatron (the hf backend saves synchronously)",
    )
    _require(
        tr.max_steps_per_run >= 0,
        f"trainer.max_steps_per_run must be >= 0 (0: no limit), got {tr.max_steps_per_run}",
    )
    _require(cfg.model.logprob_chunk_size >= 0, "model.logprob_chunk_size must be >= 0 (0 = auto)")
    _one_of("model.kernel_backend", cfg.model.kernel_backend, KERNEL_BACKENDS)
    _require(
        cfg.sft_warmup.steps >= 0 and cfg.sft_warmup.batch_size >= 1, "sft_warmup.steps >= 0, batch_size >= 1"
    )
    _require(cfg.logger.console_interval >= 1, "logger.console_interval must be >= 1")
    check_parallel_static(cfg)  # every backend: a bad value fails at start even where unused
    if megatron:
        check_parallel_for_megatron(cfg)
    else:  # the hf backend shards nothing: a tp/pp layout would train silently unparallel
        tp, pp = cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size
        _require(
            tp == 1 and pp == 1,
            f"parallel.tensor_model_parallel_size={tp} x pipeline_model_parallel_size={pp} needs model=megatron "
            f"(model.backend={cfg.model.backend!r} runs the whole model in each process); add model=megatron "
            "and start it with torchrun (docs/megatron.md), or drop the parallel= override",
        )
    _validate_eval(cfg)
    _validate_absolute_zero(cfg)
    if cfg.rollout.workflow in ("rlcr", "rlcr_two_turn", "rlcr_single_turn"):
        _validate_rlcr(cfg)
    else:
        _require(
            alg.estimator != "rlcr_hierarchical",
            "algorithm.estimator=rlcr_hierarchical needs rollout.workflow=rlcr_two_turn (answer and "
            "confidence rows with subgroup ids)",
        )


def _validate_optim(prefix: str, opt: OptimConfig) -> None:
    _one_of(f"{prefix}.schedule", opt.schedule, SCHEDULES)
    _require(opt.lr > 0, f"{prefix}.lr must be > 0, got {opt.lr}")
    _require(
        len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas),
        f"{prefix}.betas must be two values in [0, 1), got {opt.betas}",
    )
    _require(opt.grad_clip >= 0, f"{prefix}.grad_clip must be >= 0 (0 disables)")
    _require(
        opt.warmup_steps >= 0 and opt.total_steps >= 0, f"{prefix}.warmup_steps/total_steps must be >= 0"
    )
    _require(0 <= opt.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio must be in [0, 1]")


def _validate_critic(cfg: NemoAzrConfig, rows: int, rows_desc: str) -> None:
    """``critic.*`` is checked whatever the estimator (a bad value fails at start even where unused)."""
    from nemo_azr.algorithms.aggregation import AGG_MODES

    c = cfg.critic
    _validate_optim("critic.optim", c.optim)
    _one_of("critic.loss_agg_mode", c.loss_agg_mode, AGG_MODES)
    _require(
        c.cliprange_value >= 0, f"critic.cliprange_value must be >= 0 (0: no clip), got {c.cliprange_value}"
    )
    for key in ("warmup_steps", "ppo_epochs", "mini_batch_size", "micro_batch_size"):
        _require(getattr(c, key) >= 0, f"critic.{key} must be >= 0 (0: the default), got {getattr(c, key)}")
    if c.mini_batch_size and cfg.rollout.workflow != "azr":
        _require(
            rows % c.mini_batch_size == 0,
            f"critic.mini_batch_size={c.mini_batch_size} must divide the rows per step ({rows_desc} = {rows})",
        )
    if c.shared_trunk:
        _require(
            cfg.model.backend == "hf",
            "critic.shared_trunk=true puts the value head on the hf policy's trunk; with model.backend=megatron "
            "the critic is a separate model (critic.shared_trunk=false)",
        )
        _require(
            c.warmup_steps == 0,
            "critic.warmup_steps trains the critic alone, which a shared trunk cannot (one joint loss): set it to 0",
        )
        _require(c.value_loss_coef > 0, f"critic.value_loss_coef must be > 0, got {c.value_loss_coef}")
    alg = cfg.algorithm
    _require(0 <= alg.gae_lambda <= 1, f"algorithm.gae_lambda must be in [0, 1], got {alg.gae_lambda}")


def _validate_throughput(cfg: NemoAzrConfig, megatron: bool) -> None:
    """Packing, token-budget micro-batches (docs/throughput.md)."""
    alg = cfg.algorithm
    _require(
        alg.max_tokens_per_microbatch >= 0,
        f"algorithm.max_tokens_per_microbatch must be >= 0 (0: micro_batch_size rows), got {alg.max_tokens_per_microbatch}",
    )
    # Packed (thd) sequences need TransformerEngine's attention; megatron's local one refuses them
    # (docs/decisions.md). Token-budget micro-batches work on both backends.
    _require(
        not (cfg.model.sequence_packing and megatron),
        "model.sequence_packing=true is for model.backend=hf: megatron runs packed sequences only "
        "with TransformerEngine's attention (its local attention refuses them), which this backend "
        "does not wire up; use algorithm.max_tokens_per_microbatch (token-budget micro-batches)",
    )
    m = cfg.model
    if m.shared_prefix:
        _require(not megatron, "model.shared_prefix=true is for model.backend=hf")
        _require(
            not m.sequence_packing,
            "model.shared_prefix=true and model.sequence_packing=true are two layouts of the same "
            "forward: choose one (shared prefixes for many rows per prompt, packing for ragged lengths)",
        )
        _require(
            not m.gradient_checkpointing,
            "model.shared_prefix=true keeps the prefix's KV cache for the rows that share it, which "
            "transformers turns off under gradient checkpointing: set model.gradient_checkpointing=false",
        )


def _validate_off_policy(cfg: NemoAzrConfig, megatron: bool) -> None:
    """Off-policy correction and asynchronous rollout (docs/throughput.md)."""
    from nemo_azr.algorithms.off_policy import IS_LEVELS, OFF_POLICY_CORRECTIONS

    alg, ro = cfg.algorithm, cfg.rollout
    _one_of("algorithm.off_policy_correction", alg.off_policy_correction, OFF_POLICY_CORRECTIONS)
    _one_of("algorithm.is_level", alg.is_level, IS_LEVELS)
    _require(
        math.isfinite(alg.is_cap) and alg.is_cap >= 1.0,
        f"algorithm.is_cap must be a finite number >= 1 (an on-policy token has weight 1), got {alg.is_cap}",
    )
    _require(
        not (alg.use_rollout_logprobs and alg.off_policy_correction != "none"),
        "algorithm.off_policy_correction weighs pi_old / pi_rollout, which is 1 when "
        "algorithm.use_rollout_logprobs=true makes pi_old the rollout's: use one of them",
    )
    _require(ro.max_policy_lag >= 0, f"rollout.max_policy_lag must be >= 0, got {ro.max_policy_lag}")
    _require(
        ro.async_threads >= 0,
        f"rollout.async_threads must be >= 0 (0: the trainer's), got {ro.async_threads}",
    )
    _one_of("rollout.async_generation", ro.async_generation, ASYNC_GENERATIONS)
    if not ro.async_rollout:
        return
    _require(
        not megatron and cfg.generation.backend == "hf",
        "rollout.async_rollout=true needs model.backend=hf and generation.backend=hf (a generation "
        "backend with its own copy of the weights, loaded between rollouts)",
    )
    _require(
        ro.workflow != "azr",
        "rollout.async_rollout=true is not available for self-play (rollout.workflow=azr): its task "
        "buffers are updated by the training steps the rollout would run ahead of",
    )


def _validate_dapo(cfg: NemoAzrConfig) -> None:
    alg = cfg.algorithm
    _require(
        alg.estimator != "trr_plus_plus" or cfg.rollout.workflow == "azr",
        "algorithm.estimator=trr_plus_plus normalises per task type x role, which self-play rows carry "
        "(rollout.workflow=azr); for other tasks use grpo",
    )
    _require(
        alg.max_sampling_rounds >= 1,
        f"algorithm.max_sampling_rounds must be >= 1, got {alg.max_sampling_rounds}",
    )
    if alg.dynamic_sampling:
        _require(
            cfg.rollout.workflow != "azr",
            "algorithm.dynamic_sampling does not apply to self-play: its learnability filter already "
            "keeps the groups that teach and re-proposes the others (absolute_zero.max_repropose_attempts)",
        )
        _require(
            alg.estimator != "remax",
            "algorithm.dynamic_sampling with estimator=remax: the greedy baseline is rolled out for the "
            "first draw of prompts only; use grpo or rloo",
        )
    _require(
        0 <= alg.overlong_buffer_frac < 1,
        f"algorithm.overlong_buffer_frac must be in [0, 1) (0: off), got {alg.overlong_buffer_frac}",
    )
    if alg.overlong_buffer_frac:
        _require(alg.overlong_penalty_factor >= 0, "algorithm.overlong_penalty_factor must be >= 0")


ANSWER_DECODINGS = ("sample", "greedy")  # rlcr.answer_decoding
ASYNC_GENERATIONS = ("auto", "thread", "process")  # rollout.async_generation
DEMONSTRATION_ROLES = ("user", "assistant")
GENERATED_TASKS = ("arithmetic", "synthetic_qa")  # built from the config alone (no files to read)


def _validate_demonstrations(demos: list) -> None:
    """Alternating user/assistant messages, starting with user and ending with assistant."""
    for i, message in enumerate(demos):
        expected = DEMONSTRATION_ROLES[i % 2]
        _require(
            isinstance(message, dict) and set(message) == {"role", "content"},
            f"data.demonstrations[{i}] must be {{role: ..., content: ...}}, got {message!r}",
        )
        _require(
            message["role"] == expected,
            f"data.demonstrations[{i}].role is {message['role']!r}, expected {expected!r} "
            "(exchanges alternate user, assistant)",
        )
        _require(
            isinstance(message["content"], str) and bool(message["content"].strip()),
            f"data.demonstrations[{i}].content must be a non-empty string",
        )
    _require(
        len(demos) % 2 == 0,
        "data.demonstrations must end with an assistant message (the demonstrated answer)",
    )


def _validate_rlcr(cfg: NemoAzrConfig) -> None:
    """RLCR keys, checked only when an rlcr workflow is selected."""
    r, wf = cfg.rlcr, cfg.rollout.workflow
    _require(
        not (wf == "rlcr_two_turn" and not r.multi_turn) and not (wf == "rlcr_single_turn" and r.multi_turn),
        f"rollout.workflow={wf} contradicts rlcr.multi_turn={r.multi_turn}; set both consistently "
        "(or use rollout.workflow=rlcr, which follows rlcr.multi_turn)",
    )
    two_turn = wf == "rlcr_two_turn" or (wf == "rlcr" and r.multi_turn)
    _one_of("rlcr.answer_match", r.answer_match, ("auto", "math", "qa"))
    _one_of("rlcr.qa_match", r.qa_match, ("exact", "f1"))
    _require(0 < r.f1_threshold <= 1, f"rlcr.f1_threshold must be in (0, 1], got {r.f1_threshold}")
    _require(r.eps >= 0, f"rlcr.eps must be >= 0, got {r.eps}")
    _require(
        0 <= r.warmup_wrong_frac <= 1, f"rlcr.warmup_wrong_frac must be in [0, 1], got {r.warmup_wrong_frac}"
    )
    _require(
        r.answer_max_new_tokens >= 0 and r.confidence_max_new_tokens >= 0,
        "rlcr.answer_max_new_tokens / confidence_max_new_tokens must be >= 0 (0 = generation.max_new_tokens)",
    )
    if two_turn:
        _require(
            cfg.algorithm.estimator == "rlcr_hierarchical",
            f"rollout.workflow={wf} (two turns) needs algorithm.estimator=rlcr_hierarchical, got "
            f"{cfg.algorithm.estimator!r}: a flat estimator would mix answer and confidence rewards",
        )
        _one_of("rlcr.answer_decoding", r.answer_decoding, ANSWER_DECODINGS)
        if r.answer_decoding == "greedy":
            _require(
                r.num_generations_answer == 1,
                "rlcr.answer_decoding=greedy decodes one answer per prompt (more would be copies): set "
                f"rlcr.num_generations_answer=1, got {r.num_generations_answer}",
            )
        else:
            _require(
                r.num_generations_answer >= 2,
                f"rlcr.num_generations_answer (G_a) must be >= 2 to normalise answers per prompt, got "
                f"{r.num_generations_answer} (or rlcr.answer_decoding=greedy: one untrained answer per prompt)",
            )
        _require(
            r.num_generations_confidence >= 2,
            "rlcr.num_generations_confidence (G_c) must be >= 2 to normalise confidences per answer, "
            f"got {r.num_generations_confidence}",
        )
        _require(bool(r.confidence_prompt.strip()), "rlcr.confidence_prompt must not be empty")
        _require(
            "</confidence>" not in r.confidence_prefill,
            "rlcr.confidence_prefill must not close the <confidence> tag (the model writes the number "
            f"and the closing tag), got {r.confidence_prefill!r}",
        )
    else:
        _require(
            not r.confidence_prefill,
            "rlcr.confidence_prefill starts the confidence turn of the two-turn rollout; the single turn "
            f"has none (set rlcr.confidence_prefill=''), got {r.confidence_prefill!r}",
        )
        _require(
            cfg.algorithm.estimator != "rlcr_hierarchical",
            "algorithm.estimator=rlcr_hierarchical needs the two-turn rollout; the single turn uses a "
            "group-mean baseline (e.g. algorithm.estimator=grpo)",
        )
        for key in ("format_weight", "accuracy_weight", "brier_weight"):
            _require(getattr(r, key) >= 0, f"rlcr.{key} must be >= 0, got {getattr(r, key)}")


def _validate_eval(cfg: NemoAzrConfig) -> None:
    ev = cfg.eval
    _require(bool(ev.checkpoint), "eval.checkpoint must be auto, model or a checkpoint/model folder")
    _require(ev.num_examples >= 0, f"eval.num_examples must be >= 0 (0 = all), got {ev.num_examples}")
    _require(
        ev.answers_per_prompt >= 1 and ev.confidences_per_answer >= 1,
        "eval.answers_per_prompt and eval.confidences_per_answer must be >= 1",
    )
    _require(ev.prompts_per_batch >= 1, f"eval.prompts_per_batch must be >= 1, got {ev.prompts_per_batch}")
    _require(ev.n_bins >= 1, f"eval.n_bins must be >= 1, got {ev.n_bins}")


EVALUATOR_TYPES = ("llm", "rule")
SELFPLAY_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "trr_plus_plus", "gae")


def _validate_absolute_zero(cfg: NemoAzrConfig) -> None:
    """``absolute_zero`` keys; the band and weight checks run whenever self-play is on."""
    az, wf = cfg.absolute_zero, cfg.rollout.workflow
    _require(
        az.enabled == (wf == "azr"),
        f"absolute_zero.enabled={az.enabled} and rollout.workflow={wf} disagree: self-play needs both "
        "absolute_zero.enabled=true and rollout.workflow=azr (e.g. experiment=azr_sandbox)",
    )
    if not az.enabled:
        return
    from nemo_azr.envs import load_builtin_environments
    from nemo_azr.registry import ENVIRONMENTS

    load_builtin_environments()
    _require(
        az.env in ENVIRONMENTS,
        f"absolute_zero.env={az.env!r} is unknown; known: {', '.join(ENVIRONMENTS.names())}",
    )
    _one_of("absolute_zero.completion_evaluator_type", az.completion_evaluator_type, EVALUATOR_TYPES)
    _one_of("absolute_zero.safety_evaluator_type", az.safety_evaluator_type, EVALUATOR_TYPES)
    for key in ("safety_threshold", "completion_threshold"):
        value = getattr(az, f"learnability_{key}")
        _require(0 <= value <= 1, f"absolute_zero.learnability_{key} must be in [0, 1], got {value}")
    for dim in ("safe", "incomplete"):
        low = getattr(az, f"learnability_min_{dim}_ratio")
        high = getattr(az, f"learnability_max_{dim}_ratio")
        _require(
            0 <= low <= high <= 1,
            f"absolute_zero.learnability_min_{dim}_ratio ({low}) <= learnability_max_{dim}_ratio ({high}) "
            "must hold, both in [0, 1]",
        )
    for key in (
        "safety_reward_weight",
        "task_completion_weight",
        "format_reward_weight",
        "proposer_reward_weight",
        "proposer_format_reward_weight",
        "proposer_band_reward_weight",
        "solver_advantage_scale",
        "proposer_advantage_scale",
    ):
        _require(getattr(az, key) >= 0, f"absolute_zero.{key} must be >= 0, got {getattr(az, key)}")
    _require(az.max_repropose_attempts >= 0, "absolute_zero.max_repropose_attempts must be >= 0")
    _require(az.questions_per_group >= 1, "absolute_zero.questions_per_group must be >= 1")
    _require(az.max_env_steps >= 1, "absolute_zero.max_env_steps must be >= 1")
    _require(az.env_step_timeout_s >= 0, "absolute_zero.env_step_timeout_s must be >= 0 (0 = no limit)")
    _require(
        az.proposer_max_new_tokens >= 0 and az.solver_max_new_tokens >= 0,
        "absolute_zero.proposer_max_new_tokens / solver_max_new_tokens must be >= 0 (0 = generation.max_new_tokens)",
    )
    _one_of("absolute_zero.proposer_estimator", az.proposer_estimator, SELFPLAY_ESTIMATORS)
    _one_of("absolute_zero.proposer_rows", az.proposer_rows, ("per_prompt", "aligned"))
    _require(
        az.proposer_temperature >= 0,
        "absolute_zero.proposer_temperature must be >= 0 (0 = generation.temperature)",
    )
    _require(
        not az.proposer_temperature or cfg.model.backend == "hf",
        "absolute_zero.proposer_temperature is supported by the hf model backend only (model.backend=hf)",
    )
    _one_of("algorithm.estimator (with self-play)", cfg.algorithm.estimator, SELFPLAY_ESTIMATORS)
    _require(0 <= az.judge.default_score <= 1, "absolute_zero.judge.default_score must be in [0, 1]")
    _require(az.judge.max_new_tokens >= 1, "absolute_zero.judge.max_new_tokens must be >= 1")
    from nemo_azr.rewards.judge import check_judge_config

    check_judge_config(az.judge)
    if az.env == "sandbox_os":
        from nemo_azr.envs.sandbox_os.domain import check_sandbox_os_config

        check_sandbox_os_config(az.sandbox_os)
    lim = az.python_exec.limits
    _require(
        lim.cpu_time_s > 0 and lim.wall_time_s > 0 and lim.memory_mb > 0 and lim.max_file_bytes >= 0,
        "absolute_zero.python_exec.limits: cpu_time_s, wall_time_s, memory_mb must be > 0",
    )
    _require(
        lim.max_processes >= 0 and lim.max_output_bytes > 0,
        "absolute_zero.python_exec.limits: bad process/output limit",
    )
    _require(
        az.python_exec.max_concurrent_runs >= 0,
        "absolute_zero.python_exec.max_concurrent_runs must be >= 0 (0 = one per CPU core)",
    )
    bad = sorted(set(az.python_exec.task_types) - {"deduction", "abduction", "induction"})
    _require(
        not bad and az.python_exec.task_types,
        f"absolute_zero.python_exec.task_types has unknown {bad}; use deduction, abduction, induction",
    )


def _check_trtllm(cfg: NemoAzrConfig) -> None:
    """``generation.backend=trtllm``: the engine keys (docs/config.md) and TensorRT-LLM itself."""
    from nemo_azr.rollout.trtllm_backend import TRTLLM_MISSING, trtllm_available

    gen, t = cfg.generation, cfg.generation.trtllm
    _require(
        not gen.dtype,
        "generation.dtype is the hf backend's; the trtllm engine's dtype is generation.trtllm.dtype",
    )
    _one_of("generation.trtllm.dtype", t.dtype, ("auto", *DTYPES))
    _require(
        t.tensor_parallel_size >= 1,
        f"generation.trtllm.tensor_parallel_size must be >= 1, got {t.tensor_parallel_size}",
    )
    _require(
        0 < t.kv_cache_free_gpu_memory_fraction < 1,
        "generation.trtllm.kv_cache_free_gpu_memory_fraction must be in (0, 1), got "
        f"{t.kv_cache_free_gpu_memory_fraction}",
    )
    _require(
        t.max_batch_size >= gen.n_samples,
        f"generation.trtllm.max_batch_size={t.max_batch_size} must be >= generation.n_samples={gen.n_samples} "
        "(the engine batches a prompt's samples together)",
    )
    _require(
        t.max_seq_len >= 0,
        f"generation.trtllm.max_seq_len must be >= 0 (0 = the model's), got {t.max_seq_len}",
    )
    _require(t.refit_bucket_mb > 0, f"generation.trtllm.refit_bucket_mb must be > 0, got {t.refit_bucket_mb}")
    _require(t.probe_tolerance > 0, f"generation.trtllm.probe_tolerance must be > 0, got {t.probe_tolerance}")
    _require(t.probe_length >= 1, f"generation.trtllm.probe_length must be >= 1, got {t.probe_length}")
    _require(bool(t.probe_prompt.strip()), "generation.trtllm.probe_prompt is empty; give it some text")
    _require(t.checksum_rtol > 0, f"generation.trtllm.checksum_rtol must be > 0, got {t.checksum_rtol}")
    _require(trtllm_available(), TRTLLM_MISSING)
