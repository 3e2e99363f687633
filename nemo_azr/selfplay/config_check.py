"""Config checks of the ``absolute_zero`` keys (``nemo_azr.preflight`` runs them): the band and weights
whenever self-play is on, the environment's and the judge's own keys by their checks."""

from __future__ import annotations

from nemo_azr.config.checks import one_of, require
from nemo_azr.config.schema import NemoAzrConfig

EVALUATOR_TYPES = ("llm", "rule")
SOLVER_GATE_CLOSED = ("drop", "kl_only")  # what a held-back step does with the solver's rows
PROPOSER_ATTEMPTS = ("final", "all")  # which of a prompt's proposals train the proposer
GROUP_REPEATS = ("separate", "merge")  # how the band filter counts a question written twice in a group
SELFPLAY_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "trr_plus_plus", "gae")


def check_absolute_zero_config(cfg: NemoAzrConfig) -> None:
    """``absolute_zero`` keys; the band and weight checks run whenever self-play is on."""
    az, wf = cfg.absolute_zero, cfg.rollout.workflow
    require(
        az.enabled == (wf == "azr"),
        f"absolute_zero.enabled={az.enabled} and rollout.workflow={wf} disagree: self-play needs both "
        "absolute_zero.enabled=true and rollout.workflow=azr (e.g. experiment=azr_sandbox)",
    )
    if not az.enabled:
        return
    from nemo_azr.envs import load_builtin_environments
    from nemo_azr.registry import ENVIRONMENTS

    load_builtin_environments()
    require(
        az.env in ENVIRONMENTS,
        f"absolute_zero.env={az.env!r} is unknown; known: {', '.join(ENVIRONMENTS.names())}",
    )
    one_of("absolute_zero.completion_evaluator_type", az.completion_evaluator_type, EVALUATOR_TYPES)
    one_of("absolute_zero.safety_evaluator_type", az.safety_evaluator_type, EVALUATOR_TYPES)
    for key in ("safety_threshold", "completion_threshold"):
        value = getattr(az, f"learnability_{key}")
        require(0 <= value <= 1, f"absolute_zero.learnability_{key} must be in [0, 1], got {value}")
    for dim in ("safe", "incomplete"):
        low = getattr(az, f"learnability_min_{dim}_ratio")
        high = getattr(az, f"learnability_max_{dim}_ratio")
        require(
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
        "proposer_repetition_penalty",
        "solver_advantage_scale",
        "proposer_advantage_scale",
    ):
        require(getattr(az, key) >= 0, f"absolute_zero.{key} must be >= 0, got {getattr(az, key)}")
    require(
        0 <= az.solver_gate_learnable_ratio <= 1,
        f"absolute_zero.solver_gate_learnable_ratio must be in [0, 1] (0 = off), got {az.solver_gate_learnable_ratio}",
    )
    require(
        0 <= az.solver_gate_decay < 1,
        f"absolute_zero.solver_gate_decay must be in [0, 1), got {az.solver_gate_decay}",
    )
    require(
        az.solver_gate_max_consecutive >= 0,
        f"absolute_zero.solver_gate_max_consecutive must be >= 0 (0 = no cap), got {az.solver_gate_max_consecutive}",
    )
    one_of("absolute_zero.solver_gate_closed", az.solver_gate_closed, SOLVER_GATE_CLOSED)
    kl = cfg.algorithm.kl
    require(
        az.solver_gate_closed != "kl_only" or (kl.coef > 0 and kl.mode == "loss"),
        "absolute_zero.solver_gate_closed=kl_only keeps a held-back solver's rows for their KL term, which "
        f"needs algorithm.kl.coef > 0 and algorithm.kl.mode=loss (got coef {kl.coef}, mode {kl.mode})",
    )
    require(
        az.proposer_references >= 0 and az.proposer_reference_buffer >= 1,
        "absolute_zero.proposer_references must be >= 0 (0 = off) and proposer_reference_buffer >= 1, "
        f"got {az.proposer_references} and {az.proposer_reference_buffer}",
    )
    from nemo_azr.contracts.capabilities import KeysQuestions, ShowsReferenceTasks

    _require_proposer_capability(
        az, "proposer_references", ShowsReferenceTasks, "cannot show reference tasks to its proposer",
        "templated groups have no proposer prompt",
    )  # fmt: skip
    _require_proposer_capability(
        az, "proposer_repetition_penalty", KeysQuestions, "cannot tell two of its questions apart",
        "templated groups have no proposer rows",
    )  # fmt: skip
    require(
        az.solver_plain_tasks >= 0,
        f"absolute_zero.solver_plain_tasks must be >= 0 (0 = off), got {az.solver_plain_tasks}",
    )
    if az.solver_plain_tasks:
        from nemo_azr.contracts.capabilities import PlainTasks
        from nemo_azr.registry import ENVIRONMENTS

        require(
            issubclass(ENVIRONMENTS.get(az.env), PlainTasks),
            f"absolute_zero.solver_plain_tasks: absolute_zero.env={az.env} cannot pose a seed's goal "
            "alone (sandbox_os can); set absolute_zero.solver_plain_tasks=0",
        )
    require(az.max_repropose_attempts >= 0, "absolute_zero.max_repropose_attempts must be >= 0")
    require(az.questions_per_group >= 1, "absolute_zero.questions_per_group must be >= 1")
    require(az.max_env_steps >= 1, "absolute_zero.max_env_steps must be >= 1")
    require(az.env_step_timeout_s >= 0, "absolute_zero.env_step_timeout_s must be >= 0 (0 = no limit)")
    require(
        az.proposer_max_new_tokens >= 0 and az.solver_max_new_tokens >= 0,
        "absolute_zero.proposer_max_new_tokens / solver_max_new_tokens must be >= 0 (0 = generation.max_new_tokens)",
    )
    one_of("absolute_zero.proposer_estimator", az.proposer_estimator, SELFPLAY_ESTIMATORS)
    one_of("absolute_zero.proposer_rows", az.proposer_rows, ("per_prompt", "aligned"))
    one_of("absolute_zero.proposer_attempts", az.proposer_attempts, PROPOSER_ATTEMPTS)
    one_of("absolute_zero.curriculum_feedback", az.curriculum_feedback, ("final", "first_pass"))
    one_of("absolute_zero.group_repeats", az.group_repeats, GROUP_REPEATS)
    require(
        az.proposer_temperature >= 0,
        "absolute_zero.proposer_temperature must be >= 0 (0 = generation.temperature)",
    )
    require(
        not az.proposer_temperature or cfg.model.backend == "hf",
        "absolute_zero.proposer_temperature is supported by the hf model backend only (model.backend=hf)",
    )
    one_of("algorithm.estimator (with self-play)", cfg.algorithm.estimator, SELFPLAY_ESTIMATORS)
    require(0 <= az.judge.default_score <= 1, "absolute_zero.judge.default_score must be in [0, 1]")
    require(az.judge.max_new_tokens >= 1, "absolute_zero.judge.max_new_tokens must be >= 1")
    from nemo_azr.rewards.judge import check_judge_config

    check_judge_config(az.judge)
    if az.env == "sandbox_os":
        from nemo_azr.envs.sandbox_os.domain import check_sandbox_os_config

        check_sandbox_os_config(az.sandbox_os)
        require(
            not az.sandbox_os.warmup_read_first or az.max_env_steps >= 2,
            "absolute_zero.sandbox_os.warmup_read_first=true trains two-turn solutions; "
            f"set absolute_zero.max_env_steps >= 2 (got {az.max_env_steps})",
        )
    lim = az.python_exec.limits
    require(
        lim.cpu_time_s > 0 and lim.wall_time_s > 0 and lim.memory_mb > 0 and lim.max_file_bytes >= 0,
        "absolute_zero.python_exec.limits: cpu_time_s, wall_time_s, memory_mb must be > 0",
    )
    require(
        lim.max_processes >= 0 and lim.max_output_bytes > 0,
        "absolute_zero.python_exec.limits: bad process/output limit",
    )
    require(
        az.python_exec.max_concurrent_runs >= 0,
        "absolute_zero.python_exec.max_concurrent_runs must be >= 0 (0 = one per CPU core)",
    )
    bad = sorted(set(az.python_exec.task_types) - {"deduction", "abduction", "induction"})
    require(
        not bad and az.python_exec.task_types,
        f"absolute_zero.python_exec.task_types has unknown {bad}; use deduction, abduction, induction",
    )


def _require_proposer_capability(az, key: str, capability: type, cannot: str, why_proposal: str) -> None:
    """An ``absolute_zero.<key>`` that is on needs an environment with ``capability`` (a Protocol of
    contracts/capabilities) and a proposer (``enable_task_proposal``)."""
    from nemo_azr.registry import ENVIRONMENTS

    if not getattr(az, key):
        return
    require(
        issubclass(ENVIRONMENTS.get(az.env), capability),
        f"absolute_zero.{key}: absolute_zero.env={az.env} {cannot} (sandbox_os can); set absolute_zero.{key}=0",
    )
    require(
        az.enable_task_proposal,
        f"absolute_zero.{key} needs absolute_zero.enable_task_proposal=true ({why_proposal})",
    )
