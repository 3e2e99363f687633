"""Direct preference optimisation in the trainer (seed 004, class 5; ``preference.loss``).

The step runs the same four stages as reinforcement learning with three of them empty: the rollout
stage reads the step's pairs (``tasks/preference_workflow.py``), the reward stage keeps each row's
label as its reward, there is no advantage, and the update is the policy's ``preference_step``
against the frozen reference's log-probs, computed once per batch here. Resume, checkpoints,
logging, preemption and the weight sync are the trainer's own.
"""

from __future__ import annotations

import time
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.capabilities import PreferencePolicy
from nemo_azr.contracts.preference import kto_rows
from nemo_azr.contracts.task import Task
from nemo_azr.errors import ConfigError
from nemo_azr.tasks.dataloader import build_prompt_loader
from nemo_azr.tasks.preference_data import (
    arithmetic_pairs,
    load_pairs_jsonl,
    load_unpaired_jsonl,
    pair_examples,
    unpaired_examples,
)
from nemo_azr.tasks.preference_workflow import PreferencePairsWorkflow
from nemo_azr.trainer.async_rollout import Rollout
from nemo_azr.trainer.samples import select_samples
from nemo_azr.trainer.step_metrics import peak_rss_gb

__all__ = ["PreferenceModeMixin", "preference_pairs_source"]


def preference_pairs_source(cfg: NemoAzrConfig, task: Task, tokenizer) -> tuple[Any, PreferencePairsWorkflow]:
    """The loader over the run's pairs (``preference.pairs_path``, or generated from the arithmetic
    task's training problems) or unpaired examples (``preference.unpaired_path``, KTO) and the
    workflow that makes a step's batch of them."""
    pref = cfg.preference
    if pref.unpaired_path:
        examples = unpaired_examples(load_unpaired_jsonl(pref.unpaired_path))
    elif pref.pairs_path:
        examples = pair_examples(load_pairs_jsonl(pref.pairs_path))
    else:
        examples = pair_examples(arithmetic_pairs(task.examples, seed=cfg.seed, style=pref.pair_style))
    generated = not (pref.pairs_path or pref.unpaired_path)
    workflow = PreferencePairsWorkflow(task, tokenizer, task_prompts=generated, kl_rows=pref.loss == "kto")
    return build_prompt_loader(examples, cfg.data, cfg.seed), workflow


class PreferenceModeMixin:
    """``_train_on_pairs`` for :class:`~nemo_azr.trainer.trainer.Trainer` (mixed in)."""

    cfg: NemoAzrConfig
    policy: Any
    ref: Any
    backend: Any
    state: Any
    last_samples: list

    def _check_preference_policy(self) -> None:
        if not isinstance(self.policy, PreferencePolicy):
            raise ConfigError(
                f"preference.loss={self.cfg.preference.loss}: model.backend={self.cfg.model.backend} has no "
                "preference step; use model.backend=hf"
            )

    def _train_on_pairs(self, step: int, rollout: Rollout) -> dict[str, float]:
        """The reference's log-probs, one preference step, the weight sync; the step's metrics."""
        pref, batch = self.cfg.preference, rollout.batch
        metrics = dict(rollout.metrics)
        t_start = time.perf_counter()
        batch[F.REF_LOGPROBS] = self.ref.compute_logprobs(batch)
        t_logprob = time.perf_counter()
        metrics.update(
            self.policy.preference_step(
                batch,
                loss=pref.loss,
                beta=pref.beta,
                label_smoothing=pref.label_smoothing,
                desirable_weight=pref.desirable_weight,
                undesirable_weight=pref.undesirable_weight,
                nll_weight=pref.nll_weight,
            )
        )
        t_update = time.perf_counter()
        self.backend.sync_weights(self.policy)  # an evaluation or a sample drawn later sees the new weights
        self.state.policy_version = self.backend.version
        t_refit = time.perf_counter()
        self.state.samples_seen += len(batch)
        self.state.consecutive_skips = 0
        labelled = (
            batch.index(kto_rows(batch)[0]) if F.KL_ROW in batch.meta else batch
        )  # not KTO's mismatched rows
        self.last_samples = select_samples(labelled, self.cfg.logger.samples_per_step, step=step + 1)
        lengths = batch[F.LOSS_MASK].float().sum(-1)
        metrics.update(
            {
                "batch/rows": float(len(batch)),
                "batch/tokens": float(lengths.sum()),
                "response/length_mean": float(lengths.mean()),
                "response/length_max": float(lengths.max()),
                "timing/rollout_s": rollout.rollout_s,
                "timing/reward_s": rollout.reward_s,
                "timing/logprob_s": t_logprob - t_start,
                "timing/update_s": t_update - t_logprob,
                "timing/refit_s": t_refit - t_update,
                "timing/step_s": 0.0,  # set by train_step
                "system/peak_rss_gb": peak_rss_gb(),
                "trainer/policy_version": float(self.state.policy_version),
                "trainer/samples_seen": float(self.state.samples_seen),
                "trainer/skipped_steps": float(self.state.skipped_steps),
            }
        )
        return metrics
