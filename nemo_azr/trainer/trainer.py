"""The fit loop: rollout -> reward -> old/ref log-probs -> advantage -> update -> sync -> log -> checkpoint."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

import nemo_azr.algorithms  # noqa: F401  (registers estimators and losses)
import nemo_azr.rlcr  # noqa: F401  (registers the RLCR workflows and estimator)
import nemo_azr.rollout  # noqa: F401  (registers generation backends)
import nemo_azr.selfplay  # noqa: F401  (registers the azr self-play workflow)
from nemo_azr.algorithms.dapo import (
    apply_overlong_penalty,
    first_groups,
    informative_rows,
    num_groups,
    retag_round,
)
from nemo_azr.algorithms.objective import apply_kl_reward_penalty
from nemo_azr.algorithms.off_policy import rollout_is_weights
from nemo_azr.algorithms.per_role import role_split_estimator
from nemo_azr.config.loader import to_yaml
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch, Role, validate_batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import rollout_logprob_gap
from nemo_azr.contracts.capabilities import PerRoleAdvantages, RewardScorer, RowsPerPrompt
from nemo_azr.contracts.schema import OLD_LOGPROBS_FROM_UPDATE, PROMPT_FEEDBACK
from nemo_azr.contracts.update import CRITIC_SHUFFLE_SALT, POLICY_SHUFFLE_SALT, UpdateContext
from nemo_azr.errors import (
    BatchContractError,
    CheckpointError,
    ConfigError,
    RewardError,
)
from nemo_azr.models.hf.critic import SharedTrunkCritic
from nemo_azr.models.tiny import load_tokenizer, resolve_model_path
from nemo_azr.registry import (
    ADVANTAGE_ESTIMATORS,
    CRITIC_BACKENDS,
    GENERATION_BACKENDS,
    POLICY_BACKENDS,
    WORKFLOWS,
)
from nemo_azr.rewards.reward_model_process import build_reward_scorer
from nemo_azr.rollout.hf_backend import backend_kwargs, sampling_from_config
from nemo_azr.rollout.process_backend import ProcessGenerationBackend
from nemo_azr.selfplay.task import build_selfplay_task
from nemo_azr.tasks import build_task
from nemo_azr.tasks.dataloader import build_prompt_loader
from nemo_azr.trainer.async_rollout import (
    AsyncRollout,
    Rollout,
    async_generation_mode,
    device_of,
    uncorrected_lag_warning,
)
from nemo_azr.trainer.checkpoint import CHECKPOINT_DIR, Checkpointer, checkpoint_step
from nemo_azr.trainer.checkpointing import (
    SFT_WARMUP_FILE,
    CheckpointingMixin,
    TrainerState,
    is_main_process,
    launch_rank,
)
from nemo_azr.trainer.flops import ModelShape, device_peak_flops, mfu_metrics
from nemo_azr.trainer.metrics import MetricsLogger
from nemo_azr.trainer.model_rewards import add_reward_model_scores
from nemo_azr.trainer.output_lock import acquire_output_lock, release_output_lock
from nemo_azr.trainer.preemption import Preempted, PreemptionFlag, agree_on_signal
from nemo_azr.trainer.preference_mode import PreferenceModeMixin, preference_pairs_source
from nemo_azr.trainer.preflight import check_writable, resolve_device
from nemo_azr.trainer.progress import WARMUP_PROGRESS_EVERY, WARMUP_PROGRESS_SECONDS, StepProgress
from nemo_azr.trainer.rewards import drop_nonfinite_rewards, score_batch
from nemo_azr.trainer.row_versions import check_row_versions
from nemo_azr.trainer.samples import select_samples
from nemo_azr.trainer.sft import SFTWarmup
from nemo_azr.trainer.step_metrics import (
    batch_metrics,
    check_finite_loss,
    finite_loss,
    peak_rss_gb,
    policy_step_flops,
    role_kl_metrics,
)
from nemo_azr.utils.atomic_io import atomic_write_text
from nemo_azr.utils.seeding import rng_state, seed_everything, set_rng_state, step_seed


@dataclass
class FitResult:
    status: str  # "completed" | "preempted" (signal) | "paused" (trainer.max_steps_per_run reached)
    step: int
    last_metrics: dict[str, float]
    checkpoint: Path | None


@dataclass
class _RunProgress:
    """What the step loop leaves for the end of a run."""

    dirty: bool  # the weights hold something no checkpoint does
    resume: Path | None  # the checkpoint the run started from
    status: str = "completed"
    last: dict[str, float] = field(default_factory=dict)  # the last step's metrics
    last_saved: Path | None = None


class _NullLogger:
    """The metrics logger of ranks > 0 (every rank computes the same metrics; rank 0 writes them)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_samples(self, step: int, records: list) -> None:
        pass

    def step_started(self, step: int) -> None:
        pass

    def message(self, msg: str) -> None:
        pass

    def close(self) -> None:
        pass


class Trainer(CheckpointingMixin, PreferenceModeMixin):
    async_rollout: AsyncRollout | None = None  # rollout.async_rollout: the producer thread, while fit runs
    _holds_output_lock = False  # this trainer's share of the output folder's run lock (released by fit)

    def __init__(self, cfg: NemoAzrConfig, *, preemption: PreemptionFlag | None = None) -> None:
        """Build the task, tokenizer and models. A preemption signal (SIGTERM/SIGUSR1) during the
        build raises :class:`~nemo_azr.trainer.preemption.Preempted` at once (there is nothing to
        save yet); ``nemo-azr train`` installs ``preemption`` before anything else."""
        self.preemption = preemption if preemption is not None else PreemptionFlag()
        installed = self.preemption.install()
        try:
            with self.preemption.phase("model build", interruptible=True):
                self._build(cfg)
        finally:
            if installed:  # a Trainer used as a library: fit() installs it again
                self.preemption.uninstall()

    def _build(self, cfg: NemoAzrConfig) -> None:
        self.cfg = cfg
        tr = cfg.trainer
        if tr.num_threads > 0:
            torch.set_num_threads(tr.num_threads)
        if tr.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        seed_everything(cfg.seed)
        self.device = resolve_device(tr.device)
        self.output_dir = Path(tr.output_dir)
        self.checkpointer = Checkpointer(self.output_dir / CHECKPOINT_DIR, keep_last=tr.keep_last)
        if is_main_process():  # rank 0 writes the logs and publishes checkpoints
            check_writable(self.output_dir, "trainer.output_dir")
            check_writable(self.checkpointer.root, "trainer.output_dir (its checkpoints/ folder)")
        self._take_output_lock()  # before anything is written into the folder

        # First: a data problem should not wait for a model load. Self-play draws its prompts from
        # the environment's seed tasks.
        self.task = build_selfplay_task(cfg) if cfg.absolute_zero.enabled else build_task(cfg.data)
        self.model_path = resolve_model_path(cfg.model.path, cfg.model.tiny)
        megatron_ckpt = (self.model_path / "dist").is_dir()
        if megatron_ckpt and cfg.model.backend != "megatron":
            raise ConfigError(
                f"model.path {self.model_path} is a megatron checkpoint: use model.backend=megatron, "
                "or export it with `nemo-azr convert megatron-to-hf`"
            )
        self.tokenizer = load_tokenizer(self.model_path / "model" if megatron_ckpt else self.model_path)
        if cfg.preference.loss:  # class 5: the steps read preference pairs instead of rolling out
            self.loader, self.workflow = preference_pairs_source(cfg, self.task, self.tokenizer)
        else:
            self.loader = build_prompt_loader(self.task.examples, cfg.data, cfg.seed)
            self.workflow = WORKFLOWS.get(cfg.rollout.workflow)(self.task, self.tokenizer, cfg)
        per_role = isinstance(self.workflow, PerRoleAdvantages)
        role_estimators = self.workflow.role_estimators if per_role else None
        self.estimator = (
            role_split_estimator(role_estimators, self.workflow.role_advantage_scales)
            if per_role
            else ADVANTAGE_ESTIMATORS.get(cfg.algorithm.estimator)
        )

        policy_cls = POLICY_BACKENDS.get(cfg.model.backend)
        self.policy = policy_cls(self.model_path, cfg, trainable=True, device=self.device)
        self.critic = self._build_critic(role_estimators)  # first: a shared-trunk head joins the optimizer
        self.policy.setup_optimizer(total_steps=self._optimizer_steps_total())
        self.reward_model: RewardScorer | None = build_reward_scorer(
            cfg.reward_model, self.device, self.tokenizer
        )
        self.ref = None
        if cfg.preference.loss:
            self._check_preference_policy()
        if cfg.algorithm.kl.coef > 0 or cfg.preference.loss:
            # frozen copy of the initial policy (kl.reference=warmup: reloaded later)
            self.ref = policy_cls(self.model_path, cfg, trainable=False, device=self.device)
        self.backend = None
        self.state = TrainerState()
        self.sampling = sampling_from_config(cfg.generation)
        self.norm_length = cfg.algorithm.norm_length or cfg.generation.max_new_tokens
        self.last_samples: list[dict] = []  # the last step's sample texts (logger.samples_per_step)
        self._reward_error_reported = False
        # MFU per step (throughput/mfu): the policy's shape from its HF config, the device's peak
        try:
            self._model_shape: ModelShape | None = ModelShape.from_hf_config(self.policy.hf_config)
        except AttributeError:  # a config without the usual decoder fields: no FLOP count, no MFU
            self._model_shape = None
        self._peak_flops = device_peak_flops(self.device)
        self._last_flops: dict[str, float] | None = None

    def _optimizer_steps_total(self, model=None) -> int:
        """Optimizer steps of the whole run for ``model`` (the policy, or the critic with its own
        epochs / mini-batches): the LR schedule's horizon."""
        if self.cfg.preference.loss and model is None:  # one preference step per training step
            return self.cfg.trainer.max_steps
        epochs, mini, _ = (model or self.policy).update_schedule()
        # A workflow may produce more rows per prompt than n_samples (RLCR two-turn: G_a + G_a x G_c).
        per_prompt = (
            self.workflow.rows_per_prompt
            if isinstance(self.workflow, RowsPerPrompt)
            else self.cfg.generation.n_samples
        )
        rows = self.cfg.data.prompts_per_step * per_prompt
        per_step = epochs * max(1, rows // (mini or rows))
        return per_step * self.cfg.trainer.max_steps

    def _build_critic(self, role_estimators: dict[str, str] | None):
        """PPO's critic when the advantage estimator needs values (``gae``), else None. Self-play with
        ``critic.per_role_values`` gets one value head per role."""
        if F.VALUES not in self.estimator.required_keys:
            return None
        cfg = self.cfg
        roles = (
            list(role_estimators) if role_estimators and cfg.critic.per_role_values else [Role.SOLVER.value]
        )
        if cfg.critic.shared_trunk:  # the value head on the policy's trunk, trained by the joint loss
            return SharedTrunkCritic(self.policy, cfg, roles=roles)
        path = (
            resolve_model_path(cfg.critic.model_path, cfg.model.tiny)
            if cfg.critic.model_path
            else self.model_path
        )
        critic = CRITIC_BACKENDS.get(cfg.model.backend)(path, cfg, roles=roles, device=self.device)
        critic.setup_optimizer(total_steps=self._optimizer_steps_total(critic))
        return critic

    # --- one step --------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """One step: a rolled-out, scored batch (produced here, or taken from the asynchronous
        producer, ``rollout.async_rollout``), then log-probs, advantages, update and weight sync."""
        self.last_samples = []
        t_start = time.perf_counter()
        if self.async_rollout is None:
            seed_everything(step_seed(self.cfg.seed, step))
            rollout = self.produce_rollout(step)
            wait_s = None
        else:
            t_wait = time.perf_counter()
            rollout = self.async_rollout.take(step, self.state.policy_version)
            wait_s = time.perf_counter() - t_wait
        try:
            if rollout.batch is not None:  # sync: the version last pushed; async: the producer's own
                expected = self.state.policy_version if self.async_rollout is None else rollout.policy_version
                check_row_versions(rollout.batch, expected)
            metrics = self._train_on(step, rollout)
        finally:
            if self.async_rollout is not None:
                self.async_rollout.step_done(step)
        if "timing/step_s" in metrics:  # the trainer's wall time (a rollout ahead of it overlaps)
            metrics["timing/step_s"] = time.perf_counter() - t_start
            if self._last_flops is not None:
                metrics.update(
                    mfu_metrics(
                        self._last_flops,
                        step_s=metrics["timing/step_s"],
                        rollout_s=metrics["timing/rollout_s"],
                        update_s=metrics["timing/update_s"],
                        peak=self._peak_flops,
                    )
                )
        if wait_s is not None:
            metrics["async/wait_s"] = wait_s
            metrics.update(rollout.lag_metrics)
        return metrics

    def produce_rollout(self, step: int) -> Rollout:
        """Rollout -> reward -> (DAPO sampling, overlong shaping, ReMax baseline): the part of a step
        that only needs the generation backend and the data (the asynchronous producer runs it)."""
        cfg, alg = self.cfg, self.cfg.algorithm
        metrics: dict[str, float] = {}
        t_start = time.perf_counter()

        def done(batch: Batch | None, skip: tuple[str, str] | None = None, *, t_rollout: float) -> Rollout:
            return Rollout(
                step=step,
                batch=batch,
                metrics=metrics,
                skip=skip,
                rollout_s=t_rollout - t_start,
                reward_s=time.perf_counter() - t_rollout,
                loader_after=self.loader.state_dict(),
                policy_version=self.backend.version,
            )

        examples = self.loader.next_batch()
        batch = self.workflow.run(examples, self.backend, self.sampling, step=step)
        self.loader.record(batch.info.get(PROMPT_FEEDBACK, {}))  # before loader_after is taken
        metrics.update(batch.info.get("metrics", {}))
        if len(batch) == 0:  # e.g. self-play where no group produced a trainable row
            return done(
                None,
                (
                    "the rollout produced no trainable rows",
                    "self-play: no question group reached the learnability band; widen the "
                    "absolute_zero.learnability_* bands or raise max_repropose_attempts",
                ),
                t_rollout=time.perf_counter(),
            )
        validate_batch(batch, "rollout")
        t_rollout = time.perf_counter()

        if F.REWARDS not in batch.tensors:  # a workflow may fuse rollout and reward
            batch = self._score(batch, metrics)
        for reason, count in batch.info.get("answer_rejections", {}).items():
            metrics[f"reward/answer_{reason}"] = float(count)
        reward_errors = batch.info.get("reward_errors")
        if reward_errors:
            metrics["reward/errors"] = float(reward_errors["count"])
            self._report_reward_error(step, reward_errors)
        batch, reward_metrics = drop_nonfinite_rewards(batch)
        metrics.update(reward_metrics)
        if batch is None:
            why = "every reward was NaN/inf" + (" or raised" if reward_errors else "")
            return done(None, (why, "check the reward function"), t_rollout=t_rollout)
        validate_batch(batch, "reward")
        if alg.dynamic_sampling:  # DAPO: keep only groups whose rewards differ, draw more prompts
            batch, sampling_metrics = self._dynamic_sampling(batch, step)
            metrics.update(sampling_metrics)
            if batch is None:
                return done(
                    None,
                    (
                        f"dynamic sampling found no group with differing rewards in "
                        f"{alg.max_sampling_rounds} rounds",
                        "raise algorithm.max_sampling_rounds, or the task is too easy / too hard for the model",
                    ),
                    t_rollout=t_rollout,
                )
        max_len = batch.info.get("max_new_tokens") or cfg.generation.max_new_tokens
        metrics.update(apply_overlong_penalty(batch, alg, max_len=max_len))
        if self.estimator.needs_greedy_baseline:
            batch[F.BASELINE_REWARDS] = self._greedy_baseline(batch, examples, step)
        self.backend.release()  # rollout done: an engine frees its GPU memory (trtllm sleeps)
        return done(batch, t_rollout=t_rollout)

    def _train_on(self, step: int, rollout: Rollout) -> dict[str, float]:
        """Log-probs -> values -> advantages -> critic and policy updates -> weight sync, on ``rollout``."""
        cfg, alg = self.cfg, self.cfg.algorithm
        metrics = dict(rollout.metrics)
        self._loader_trained = rollout.loader_after
        if rollout.skip is not None:
            return self._skip(step, metrics, *rollout.skip)
        if cfg.preference.loss:  # no advantage stage: the update compares each pair's two rows
            return self._train_on_pairs(step, rollout)
        batch = rollout.batch
        t_reward = time.perf_counter()

        weights_in_update = False
        logprob_passes = int(self.ref is not None)  # forwards over the batch besides the update
        if alg.use_rollout_logprobs:
            batch[F.OLD_LOGPROBS] = batch[F.ROLLOUT_LOGPROBS]
        elif self._old_logprobs_from_update(len(batch)):
            batch.info[OLD_LOGPROBS_FROM_UPDATE] = True
            weights_in_update = alg.off_policy_correction != "none"
        else:
            batch[F.OLD_LOGPROBS] = self.policy.compute_logprobs(batch)
            logprob_passes += 1
            metrics.update(rollout_logprob_gap(batch))  # the generation engine's vs the trainer's
        if self.ref is not None:
            batch[F.REF_LOGPROBS] = self.ref.compute_logprobs(batch)
            if alg.kl.mode == "reward":
                metrics.update(apply_kl_reward_penalty(batch, alg))
        t_logprob = time.perf_counter()

        if self.critic is not None:  # rollout-time values: GAE's input and the value clip's anchor
            batch[F.VALUES] = self.critic.compute_values(batch)
        t_values = time.perf_counter()

        advantages, returns = self.estimator(batch, alg)
        if alg.off_policy_correction != "none":  # pi_old / pi_rollout on the policy-gradient term
            self._require_rollout_logprobs(batch)
            if not weights_in_update:  # else the loss weighs with the update's own pi_old
                advantages, is_metrics = self._off_policy_weighted(batch, advantages)
                metrics.update(is_metrics)
        batch[F.ADVANTAGES] = advantages
        if returns is not None:
            batch[F.RETURNS] = returns
        validate_batch(batch, "update", extra=self.estimator.required_keys)
        if self.critic is not None:
            metrics.update(self.critic.update(batch, self._update_context(step, CRITIC_SHUFFLE_SALT)))
        t_critic = time.perf_counter()
        if self.critic is not None and step < cfg.critic.warmup_steps:
            metrics["critic/warmup"] = 1.0  # the policy waits until the values mean something
        else:
            update_metrics = self.policy.update(batch, self._update_context(step, POLICY_SHUFFLE_SALT))
            metrics.update(update_metrics)
        t_update = time.perf_counter()

        if self.async_rollout is None:
            self.backend.sync_weights(self.policy)
            self.state.policy_version = self.backend.version
        else:  # the producer loads them before its next rollout
            self.state.policy_version += 1
            self.async_rollout.push_weights(self.policy, self.state.policy_version)
        t_refit = time.perf_counter()
        metrics.update(self.backend.refit_metrics)  # trtllm: refit time, probe gap
        self.state.samples_seen += len(batch)
        self.last_samples = select_samples(batch, cfg.logger.samples_per_step, step=step + 1)
        self.state.consecutive_skips = 0
        metrics.update(batch_metrics(batch))
        metrics.update(role_kl_metrics(batch, alg.kl.estimator))
        self._last_flops = policy_step_flops(
            self._model_shape, metrics, logprob_passes=logprob_passes, update_epochs=alg.ppo_epochs
        )
        metrics.update(
            {
                "timing/rollout_s": rollout.rollout_s,
                "timing/reward_s": rollout.reward_s,
                "timing/logprob_s": t_logprob - t_reward,
                "timing/update_s": t_update - t_critic,
                "timing/refit_s": t_refit - t_update,
                **(
                    {"timing/values_s": t_values - t_logprob, "timing/critic_update_s": t_critic - t_values}
                    if self.critic is not None
                    else {}
                ),
                "timing/step_s": 0.0,  # set by train_step
                "throughput/response_tokens_per_s": metrics["batch/tokens"] / max(rollout.rollout_s, 1e-9),
                "system/peak_rss_gb": peak_rss_gb(),
                "trainer/policy_version": float(self.state.policy_version),
                "trainer/samples_seen": float(self.state.samples_seen),
                "trainer/skipped_steps": float(self.state.skipped_steps),
            }
        )
        return metrics

    def _update_context(self, step: int, salt: int) -> UpdateContext:
        return UpdateContext.for_step(seed=self.cfg.seed, step=step, salt=salt, norm_length=self.norm_length)

    def _dynamic_sampling(self, batch: Batch, step: int) -> tuple[Batch | None, dict[str, float]]:
        """DAPO's dynamic sampling: drop the groups whose rewards are all equal and roll out more
        prompts (at most ``algorithm.max_sampling_rounds`` rollouts in all) until
        ``data.prompts_per_step`` groups have a reward spread; extra groups are cut. Filtering uses the
        task's reward, before any overlong shaping (a length penalty alone must not keep a group)."""
        cfg = self.cfg
        target = cfg.data.prompts_per_step
        drawn = num_groups(batch)
        kept = batch.index(informative_rows(batch))
        rounds = 1
        while num_groups(kept) < target and rounds < cfg.algorithm.max_sampling_rounds:
            more = self.workflow.run(self.loader.next_batch(), self.backend, self.sampling, step=step)
            if F.REWARDS not in more.tensors:
                more = self._score(more, {})
            more, _ = drop_nonfinite_rewards(more)
            if more is not None:
                more = retag_round(more, rounds)
                drawn += num_groups(more)
                kept = Batch.concat([kept, more.index(informative_rows(more))])
            rounds += 1
        informative = num_groups(kept)
        if informative > target:
            kept = first_groups(kept, target)
        metrics = {
            "dapo/sampling_rounds": float(rounds),
            "dapo/groups_drawn": float(drawn),
            "dapo/groups_dropped": float(drawn - informative),
            "dapo/groups_kept": float(num_groups(kept)),
        }
        return (kept if len(kept) else None), metrics

    def _report_reward_error(self, step: int, errors: dict) -> None:
        """One stderr line the first time the reward function raises (then only the count metric)."""
        if self._reward_error_reported or not is_main_process():
            return
        self._reward_error_reported = True
        print(
            f"nemo-azr: warning: step {step + 1}: {errors['first']}; {errors['count']} row(s) dropped. "
            "Later failures are counted in reward/errors only",
            file=sys.stderr,
            flush=True,
        )

    def _off_policy_weighted(
        self, batch: Batch, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The advantages times the rollout importance weights (algorithms/off_policy.py)."""
        alg = self.cfg.algorithm
        weights, metrics = rollout_is_weights(
            batch[F.OLD_LOGPROBS],
            batch[F.ROLLOUT_LOGPROBS],
            batch[F.LOSS_MASK],
            mode=alg.off_policy_correction,
            cap=alg.is_cap,
            level=alg.is_level,
        )
        return advantages * weights.to(advantages.device), metrics

    def _require_rollout_logprobs(self, batch: Batch) -> None:
        if F.ROLLOUT_LOGPROBS not in batch.tensors:
            raise BatchContractError(
                f"algorithm.off_policy_correction={self.cfg.algorithm.off_policy_correction} needs the "
                f"rollout's log-probs, and the {self.cfg.rollout.workflow!r} workflow's batch has no "
                f"{F.ROLLOUT_LOGPROBS!r}"
            )

    def _old_logprobs_from_update(self, rows: int) -> bool:
        """True when the update is one on-policy optimizer step over the whole batch: the old
        log-probs then equal the current ones, so the separate no-grad forward pass is skipped."""
        alg = self.cfg.algorithm
        single_step = alg.ppo_epochs == 1 and alg.mini_batch_size in (0, rows)
        needs_old_before_update = self.ref is not None and alg.kl.mode == "reward"
        # Off-policy correction weighs by pi_old / pi_rollout. The loss computes token-level weights
        # from the update's own log-probs (decision 127); sequence-level weights need a row's whole
        # ratio before any token's gradient (the fused loss's chunks), so pi_old comes first.
        if alg.off_policy_correction != "none":
            needs_old_before_update |= alg.is_level != "token"
        return alg.reuse_update_logprobs and single_step and not needs_old_before_update

    def _skip(
        self, step: int, metrics: dict[str, float], why: str, hint: str = "check the reward function"
    ) -> dict[str, float]:
        self.state.skipped_steps += 1
        self.state.consecutive_skips += 1
        if self.state.consecutive_skips > self.cfg.trainer.max_skipped_steps:
            raise RewardError(
                f"step {step + 1}: {why} for {self.state.consecutive_skips} steps in a row "
                f"(trainer.max_skipped_steps={self.cfg.trainer.max_skipped_steps}); {hint}"
            )
        metrics["trainer/skipped_steps"] = float(self.state.skipped_steps)
        metrics["trainer/step_skipped"] = 1.0
        return metrics

    def _score(self, batch: Batch, metrics: dict[str, float]) -> Batch:
        """The reward stage: the task's rule reward, then the reward model's score mixed in."""
        batch = score_batch(batch, self.task)
        if self.reward_model is not None:
            metrics.update(
                add_reward_model_scores(batch, self.reward_model, self.task, self.cfg.reward_model)
            )
        return batch

    def _greedy_baseline(self, batch: Batch, examples, step: int) -> torch.Tensor:
        """ReMax: the reward of one greedy rollout per prompt, broadcast to the prompt's rows."""
        greedy = sampling_from_config(self.cfg.generation, n=1, greedy=True)
        base = self.workflow.run(examples, self.backend, greedy, step=step)
        if F.REWARDS not in base.tensors:
            base = self._score(base, {})
        base, _ = drop_nonfinite_rewards(base)
        if base is None:
            raise RewardError("the greedy baseline rollout got only NaN/inf rewards")
        by_prompt = {g: float(r) for g, r in zip(base[F.GROUP_ID], base[F.REWARDS])}
        return torch.tensor([by_prompt[g] for g in batch[F.GROUP_ID]], dtype=torch.float32)

    def setup_generation(self) -> None:
        """Create the generation backend from the current policy weights (``fit`` calls this after
        a resume or the warm-up; call it yourself to drive ``train_step`` directly)."""
        cfg = self.cfg
        # A policy that trains something other than a transformers model (Megatron) provides an
        # HF-layout model for generation; the backend refits it from the policy every step.
        backend_cls = GENERATION_BACKENDS.get(cfg.generation.backend)
        if backend_cls.reads_policy_in_place:  # megatron: the training weights
            source = self.policy
        else:
            source = self.policy.generation_model()
        self.backend = backend_cls(source, self.tokenizer, **backend_kwargs(cfg.generation, self.device))
        self.backend.version = self.state.policy_version

    # --- preemption ------------------------------------------------------------------------------
    def _preemption_agreed(self) -> bool:
        """Whether a preemption signal arrived, on any rank (under torchrun all ranks stop at the
        same step: a checkpoint is collective). Collective when there are several ranks."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.preemption.requested
        on_gpu = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

        def all_reduce_max(value: int) -> int:
            tensor = torch.tensor([value], dtype=torch.int64, device=device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            return int(tensor.item())

        return agree_on_signal(self.preemption, all_reduce_max)

    def _supervised_warmup(self, resume: Path | None) -> SFTWarmup:
        """Run (or, from a checkpoint taken part-way through it, continue) the supervised warm-up.
        A single process stops it between two steps on a preemption signal; with several ranks it
        runs to its end (the signal is then acted on before the first RL step)."""
        warmup = SFTWarmup(self.policy, self.task, self.tokenizer, self.cfg, workflow=self.workflow)
        if self.state.warmup_step is not None and resume is not None:
            try:
                state = torch.load(resume / SFT_WARMUP_FILE, weights_only=False)
            except Exception as exc:  # noqa: BLE001 - torch.load raises many types for a bad file
                raise CheckpointError(
                    f"checkpoint {resume}: {SFT_WARMUP_FILE} is unreadable ({type(exc).__name__}: {exc})"
                ) from None
            restored = rng_state()  # the replay of the warm-up's data must not move the RNG streams
            warmup.load_state_dict(state)
            set_rng_state(restored)
        single = not (dist.is_initialized() and dist.get_world_size() > 1)
        stop = (lambda: self.preemption.requested) if single and warmup.resumable else None
        if not warmup.done:  # the logger starts after it: say now what the next minutes are
            since = f", continuing after step {warmup.step} from {resume}" if warmup.step else ""
            _notice(
                f"supervised warm-up: {warmup.total} steps{since}; a line after the first step, then every "
                f"{WARMUP_PROGRESS_EVERY} steps or {WARMUP_PROGRESS_SECONDS / 60:.0f} min"
            )
        progress = StepProgress("supervised warm-up", warmup.total, _notice, first_step=warmup.step)
        warmup.run(on_step=progress, should_stop=stop)
        return warmup

    def _stop_in_warmup(self, warmup: SFTWarmup) -> FitResult:
        """A signal stopped the warm-up: save it as a resumable ``step_0`` (when it got further than
        the checkpoint it started from) and end the run."""
        folder = self._resume_folder
        if warmup.losses:
            self.state.warmup_step = warmup.step
            self._warmup = warmup
            try:
                folder = self.save_checkpoint()
                self.finalize_checkpoints(blocking=True)
            finally:
                self._warmup = None
            what = f"saved {folder} (warm-up step {warmup.step} of {warmup.total}; a resume continues it)"
        else:
            what = "nothing new to save"
        _notice(f"nemo-azr: {self.preemption.describe()}: {what}, exiting for requeue")
        return FitResult("preempted", self.state.step, {}, folder)

    # --- the loop --------------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train to ``trainer.max_steps`` (or a ``max_steps_per_run`` slice).

        A preemption signal (SIGTERM / SIGUSR1) at any point ends the run with status "preempted"
        and a checkpoint of whatever no checkpoint holds yet: while the resume checkpoint loads it
        stops at once (nothing new); during the supervised warm-up it stops after the current
        warm-up step and saves a resumable ``step_0``; after the warm-up and before the first step
        (generation set-up, W&B init) it saves ``step_0`` with the warm-up's weights; during a step
        it finishes the step and saves before logging anything.
        """
        self._resume_folder: Path | None = None
        self._take_output_lock()  # a second fit() of the same trainer
        installed = self.preemption.install()
        try:
            return self._fit()
        except Preempted:  # while loading the resume checkpoint: nothing new to keep
            _notice(f"nemo-azr: {self.preemption.describe()}: nothing new to save, exiting for requeue")
            return FitResult("preempted", self.state.step, {}, self._resume_folder)
        finally:
            self.preemption.enter("shut-down", interruptible=False)
            if installed:
                self.preemption.uninstall()
            self.release_output_lock()

    def _take_output_lock(self) -> None:
        """One run per ``trainer.output_dir`` (trainer/output_lock.py); rank 0 holds it for the job."""
        if launch_rank() == 0 and not self._holds_output_lock:  # the process group may not exist yet
            taken_over = acquire_output_lock(self.output_dir)
            self._holds_output_lock = True
            if taken_over:
                _notice(f"nemo-azr: {taken_over}")

    def release_output_lock(self) -> None:
        """Let another run use ``trainer.output_dir`` (``fit`` does this when it returns; a process
        that exits releases it too)."""
        if self._holds_output_lock:
            self._holds_output_lock = False
            release_output_lock(self.output_dir)

    def _fit(self) -> FitResult:
        started = self._start()  # resume, supervised warm-up, KL reference, generation set-up
        if isinstance(started, FitResult):  # a signal stopped the warm-up
            return started
        messages, dirty = started
        self.preemption.enter("logger start-up (W&B init)", interruptible=False)
        logger = self._start_logger(messages)
        self.preemption.enter("training", interruptible=False)
        run, run_end = _RunProgress(dirty=dirty, resume=self._resume_folder), self._run_end()
        try:
            with self._generation_for_run(run_end, logger):
                self._train_steps(run, run_end, logger)
                self._final_checkpoint(run)
        finally:
            logger.close()
        return FitResult(
            status=run.status, step=self.state.step, last_metrics=run.last, checkpoint=run.last_saved
        )

    def _start(self) -> tuple[list[str], bool] | FitResult:
        """Everything before the first RL step: the resume checkpoint, the supervised warm-up, the KL
        reference and the generation backend. Returns the lines to log and whether the weights hold
        something no checkpoint does, or the result of a run a signal stopped in the warm-up."""
        cfg = self.cfg
        self.preemption.enter("resume load", interruptible=True)
        plan = self._plan_resume()  # verified against its manifest; damaged ones skipped (auto)
        resume = plan.folder
        messages = list(plan.notes)
        self._resume_folder = resume
        if resume is not None:
            self.load_checkpoint(resume)
            self.state.resume_fallbacks += len(plan.skipped)
            messages.append(f"resumed from {resume} (step {self.state.step})")
        dirty = False  # weights that no checkpoint holds: a warm-up in this process, a trained step
        if (resume is None and cfg.sft_warmup.steps > 0) or self.state.warmup_step is not None:
            self.preemption.enter("supervised warm-up", interruptible=False)
            warmup = self._supervised_warmup(resume)
            if not warmup.done:  # a signal stopped it part-way
                return self._stop_in_warmup(warmup)
            self.state.warmup_step = None
            dirty = bool(warmup.losses)
            if warmup.losses:
                resumed = f" (resumed after step {warmup.step - len(warmup.losses)})" if resume else ""
                messages.append(
                    f"supervised warm-up: {len(warmup.losses)} steps{resumed}, "
                    f"loss {warmup.losses[0]:.3f} -> {warmup.losses[-1]:.3f}"
                )
                if cfg.sft_warmup.save:  # the RL start point, kept for evaluation
                    saved = self.save_checkpoint()
                    self.finalize_checkpoints(blocking=True)
                    dirty = False
                    messages.append(f"saved the warmed-up model as {saved}")
        # DPO's reference is the policy its steps start from: after a warm-up, the warmed-up one
        pairs_after_warmup = bool(cfg.preference.loss) and cfg.sft_warmup.steps > 0
        if self.ref is not None and (cfg.algorithm.kl.reference == "warmup" or pairs_after_warmup):
            messages.append(self._load_warmup_reference())
        self.preemption.enter("generation set-up", interruptible=False)
        self.setup_generation()
        return messages, dirty

    def _start_logger(self, messages: list[str]) -> MetricsLogger | _NullLogger:
        """The metrics logger (rank 0; the others log nothing), the resolved config beside the
        metrics, and the start-up lines."""
        cfg = self.cfg
        if is_main_process():
            logger = MetricsLogger(
                cfg.logger,
                self.output_dir,
                run_config=OmegaConf.to_container(OmegaConf.structured(cfg)),
                total_steps=cfg.trainer.max_steps,
                start_step=self.state.step,
                run_name=cfg.experiment_name,
            )
            atomic_write_text(self.output_dir / "config.yaml", to_yaml(cfg))
        else:
            logger = _NullLogger()
        for msg in messages:
            logger.message(msg)
        return logger

    def _run_end(self) -> int:
        """The step this process stops at: ``trainer.max_steps``, or the end of a
        ``max_steps_per_run`` slice (a SLURM chain link or a requeued job trains a slice, then exits 75)."""
        tr = self.cfg.trainer
        return (
            min(tr.max_steps, self.state.step + tr.max_steps_per_run)
            if tr.max_steps_per_run
            else tr.max_steps
        )

    @contextlib.contextmanager
    def _generation_for_run(self, run_end: int, logger) -> Iterator[None]:
        """``rollout.async_rollout``: a producer running rollouts ahead (its decode loop in a process of
        its own with ``async_generation=process``), stopped when the run ends however it ends."""
        cfg = self.cfg
        in_process_backend = self.backend
        try:
            if cfg.rollout.async_rollout and self.state.step < run_end:
                self._loader_trained = self.loader.state_dict()
                in_flight, dropped = self._in_flight_rollouts(logger)
                warning = uncorrected_lag_warning(cfg)
                if warning:
                    logger.message(warning)
                where = async_generation_mode(cfg.rollout.async_generation, device_of(self.backend))
                own_process = where == "process"
                if own_process:  # the decode loop in a process of its own; the thread only waits on it
                    logger.message(
                        f"nemo-azr: starting the generation process (rollout.async_generation="
                        f"{cfg.rollout.async_generation})"
                    )
                    self.backend = ProcessGenerationBackend(
                        self.backend, num_threads=cfg.rollout.async_threads or torch.get_num_threads()
                    )
                self.async_rollout = AsyncRollout(
                    self.produce_rollout,
                    self.backend,
                    start_step=self.state.step,
                    # beyond a max_steps_per_run slice: the steps sampled before its last update,
                    # kept by its checkpoint for the next slice (as an uninterrupted run samples them)
                    end_step=min(cfg.trainer.max_steps, run_end + cfg.rollout.max_policy_lag),
                    max_policy_lag=cfg.rollout.max_policy_lag,
                    seed=cfg.seed,
                    num_threads=0 if own_process else cfg.rollout.async_threads,
                    in_flight=in_flight,
                    dropped_stale=dropped,
                )
            yield
        finally:
            if self.async_rollout is not None:
                self.async_rollout.close()
                self.async_rollout = None
            if self.backend is not in_process_backend:  # the generation process: stop it
                self.backend.shutdown()
                self.backend = in_process_backend

    def _in_flight_rollouts(self, logger) -> tuple[list[Rollout], int]:
        """The rollouts the resume checkpoint kept from the producer (sampled by weights older than
        its own), with the data position after them; none when they do not follow its step."""
        saved, self._resumed_in_flight = self._resumed_in_flight, None
        if not saved:
            return [], 0
        rollouts = saved["rollouts"]
        if rollouts and rollouts[0].step != self.state.step:
            logger.message(
                f"nemo-azr: the checkpoint's in-flight rollouts start at step {rollouts[0].step + 1}, not "
                f"{self.state.step + 1}; generating them again"
            )
            return [], int(saved["dropped_stale"])
        if rollouts:
            self.loader.load_state_dict(rollouts[-1].loader_after)  # the producer's draws go on from here
        return rollouts, int(saved["dropped_stale"])

    def _train_steps(self, run: _RunProgress, run_end: int, logger) -> None:
        """The step loop: train, log, checkpoint; stop on a preemption signal (after saving what no
        checkpoint holds) or at the end of a ``max_steps_per_run`` slice."""
        cfg = self.cfg
        for step in range(self.state.step, cfg.trainer.max_steps):
            if self._preemption_agreed():  # during start-up, or during the last step's logging
                if run.dirty:
                    run.last_saved, run.dirty = self.save_checkpoint(), False
                    what = f"saved {run.last_saved}"
                else:
                    run.last_saved = run.last_saved or run.resume
                    what = "nothing new to save"
                run.status = "preempted"
                logger.message(f"nemo-azr: {self.preemption.describe()}: {what}, exiting for requeue")
                return
            logger.step_started(step + 1)  # step: the 0-based index; users see step + 1 (decision 157)
            run.last = self.train_step(step)
            self.state.step = step + 1
            run.dirty = True
            self.finalize_checkpoints(blocking=False)  # publish a finished background save
            # On a signal the checkpoint comes first: a log call that fails (W&B's service
            # process is killed with the job) must not stand between the signal and the save.
            preempted = self._preemption_agreed()
            if preempted and finite_loss(run.last):
                run.last_saved, run.dirty = self.save_checkpoint(), False
            # Saves since the previous record: the interval save below lands in the next step's
            # record (logging first, so a crash inside a save loses no record of a saved step).
            run.last["timing/save_s"] = self.take_save_seconds()
            logger.log(self.state.step, run.last)
            logger.log_samples(self.state.step, self.last_samples)
            check_finite_loss(run.last, self.state.step)
            interval = cfg.trainer.save_interval
            if interval and self.state.step % interval == 0 and run.dirty:
                run.last_saved, run.dirty = self.save_checkpoint(), False
            if preempted:
                run.status = "preempted"
                logger.message(
                    f"nemo-azr: {self.preemption.describe()}: saved {run.last_saved}, exiting for requeue"
                )
                return
            if self.state.step >= run_end and self.state.step < cfg.trainer.max_steps:
                if run.last_saved is None or checkpoint_step(run.last_saved) != self.state.step:
                    run.last_saved = self.save_checkpoint()
                run.status = "paused"
                per_run = cfg.trainer.max_steps_per_run
                logger.message(f"trainer.max_steps_per_run={per_run}: saved {run.last_saved}, exiting")
                return

    def _final_checkpoint(self, run: _RunProgress) -> None:
        """A completed run ends with a checkpoint of its last step (the resume checkpoint itself when
        there was nothing left to train); nothing may be left half-written at exit."""
        if (
            run.status == "completed"
            and not run.dirty
            and run.resume is not None
            and (checkpoint_step(run.resume) == self.state.step)
        ):
            run.last_saved = run.resume  # nothing left to train (e.g. a spare chain link): keep it
        elif run.status == "completed" and (
            run.dirty or run.last_saved is None or checkpoint_step(run.last_saved) != self.state.step
        ):
            run.last_saved = self.save_checkpoint()
        self.finalize_checkpoints(blocking=True)


def _notice(text: str) -> None:
    """A line for the user before the metrics logger exists (rank 0 only)."""
    if is_main_process():
        print(text, file=sys.stderr, flush=True)
