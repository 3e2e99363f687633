"""``nemo-azr eval``: score a checkpoint (or the untrained model) on the held-out split, no training.

The run's own rollout workflow is used, so the prompts, answer parsing and rewards are exactly the
training ones: ``single_turn`` workflows report accuracy (the task's reward); RLCR workflows also
report calibration (ECE, Brier, AUROC, reliability diagram; :mod:`nemo_azr.evaluation.rlcr`).
Decoding is greedy by default (``eval.greedy``), so "before" and "after" are one deterministic
command each. Written to ``eval.output_dir`` (default ``<trainer.output_dir>/eval``):
``metrics.json`` and ``samples.jsonl`` (every prompt and response scored).
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import ConfigError
from nemo_azr.evaluation.common import (  # noqa: F401  (re-exported: the eval API of earlier releases)
    CHECKPOINT_DIR,
    METRICS_FILE,
    SAMPLES_FILE,
    EvalModel,
    eval_output_dir,
    example_kind,
    load_eval_model,
    resolve_eval_model,
    sample_records,
    write_records,
    write_results,
)

REPHRASED_SAMPLES_FILE = "samples_rephrased.jsonl"

EVAL_SEED_SALT = 104729
ACCURACY_WORKFLOWS = ("single_turn",)


def eval_config(cfg: NemoAzrConfig) -> NemoAzrConfig:
    """The run's config with the eval sample counts in place of the training ones (one answer and
    one confidence per prompt when greedy: more would be copies)."""
    out = copy.deepcopy(cfg)
    answers = 1 if cfg.eval.greedy else cfg.eval.answers_per_prompt
    out.rlcr.num_generations_answer = answers
    out.rlcr.answer_decoding = "sample"  # eval decoding follows eval.greedy, not the training turn's
    out.rlcr.num_generations_confidence = 1 if cfg.eval.greedy else cfg.eval.confidences_per_answer
    # the model states its confidence as it writes it (rlcr.confidence_decoding=enumerate is how
    # training reads the confidence's distribution, not what the model says); a run trained that way
    # also gets its expected confidence over the candidates, read beside the written one
    if cfg.rlcr.confidence_decoding == "enumerate" and cfg.rlcr.analyses_per_answer > 0:
        # an analysis is decoded as in training, then the likeliest candidate after it is what the
        # model states (greedy decoding's), the candidates' mean its expected confidence
        out.rlcr.analyses_per_answer = 1 if cfg.eval.greedy else cfg.eval.confidences_per_answer
    else:
        if cfg.rlcr.confidence_decoding == "enumerate":
            out.rlcr.expected_confidence_readout = True
        out.rlcr.confidence_decoding = "sample"
    out.generation.n_samples = answers
    return out


class EvalRun:
    """Model, tokenizer, task (held-out split), workflow, backend and sampling of one evaluation."""

    def __init__(self, cfg: NemoAzrConfig) -> None:
        import nemo_azr.rlcr  # noqa: F401  (registers the RLCR workflows)
        from nemo_azr.registry import WORKFLOWS
        from nemo_azr.rollout.hf_backend import sampling_from_config
        from nemo_azr.tasks import build_task

        self.cfg = cfg
        self.task = build_task(cfg.data, split="eval")
        loaded = load_eval_model(cfg)
        self.model_dir, self.source = loaded.model_dir, loaded.source
        self.tokenizer, self.backend = loaded.tokenizer, loaded.backend
        self.eval_cfg = eval_config(cfg)
        self.workflow = WORKFLOWS.get(cfg.rollout.workflow)(self.task, self.tokenizer, self.eval_cfg)
        self.sampling = sampling_from_config(self.eval_cfg.generation, greedy=cfg.eval.greedy)
        self.examples = self._select_examples()
        self.generated_tokens = 0
        self.seconds = 0.0

    def _select_examples(self) -> list:
        examples = list(self.task.examples)
        n = self.cfg.eval.num_examples
        if n and n < len(examples):
            keep = sorted(random.Random(self.cfg.seed).sample(range(len(examples)), n))
            examples = [examples[i] for i in keep]
        return examples

    def batches(self, examples: list | None = None, label: str = "eval") -> Iterator[Batch]:
        """The workflow's scored batches over ``examples`` (default: the held-out examples),
        ``eval.prompts_per_batch`` at a time."""
        from nemo_azr.trainer.rewards import score_batch
        from nemo_azr.utils.seeding import seed_everything, step_seed

        examples = self.examples if examples is None else examples
        per_batch = self.cfg.eval.prompts_per_batch
        total = len(examples)
        for index, start in enumerate(range(0, total, per_batch)):
            seed_everything(step_seed(self.cfg.seed, index, salt=EVAL_SEED_SALT))
            begin = time.perf_counter()
            batch = self.workflow.run(
                examples[start : start + per_batch], self.backend, self.sampling, step=index
            )
            self.seconds += time.perf_counter() - begin
            self.generated_tokens += int(batch[F.LOSS_MASK].sum()) if len(batch) else 0
            if F.REWARDS not in batch.tensors:
                batch = score_batch(batch, self.task, errors="raise")
            print(f"{label}: {min(start + per_batch, total)}/{total} prompts", flush=True)
            yield batch

    def summary(self) -> dict[str, Any]:
        return {
            "checkpoint": self.source,
            "workflow": self.cfg.rollout.workflow,
            "greedy": self.cfg.eval.greedy,
            "num_prompts": len(self.examples),
            "generation_s": round(self.seconds, 2),
            "generated_tokens_per_s": round(self.generated_tokens / self.seconds, 1)
            if self.seconds
            else None,
        }

    def output_dir(self) -> Path:
        return eval_output_dir(self.cfg)


def accuracy_block(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy, truncation and (where the task records kinds) accuracy per kind of some records."""
    rewards = [r["reward"] for r in records]
    block: dict[str, Any] = {
        "num_responses": len(records),
        "accuracy": sum(rewards) / len(rewards) if rewards else math.nan,
        "truncated_frac": sum(r["finish_reason"] == "length" for r in records) / len(records)
        if records
        else math.nan,
    }
    kinds = sorted({r["kind"] for r in records if "kind" in r})
    if kinds:
        block["by_kind"] = {
            kind: {
                "n": len(rows := [r["reward"] for r in records if r.get("kind") == kind]),
                "accuracy": sum(rows) / len(rows),
            }
            for kind in kinds
        }
    return block


def run_accuracy_eval(run: EvalRun) -> dict[str, Any]:
    """Accuracy of a single-turn workflow: the mean of the task's 0/1 reward over the responses, per
    kind where the task has kinds, and on the task's held-out phrasings where it has them."""
    from nemo_azr.contracts.capabilities import RephrasedEvalSet

    records: list[dict[str, Any]] = []
    for batch in run.batches():
        records.extend(sample_records(batch))
    result = {**run.summary(), **accuracy_block(records)}
    out = run.output_dir()
    if run.cfg.eval.rephrased and isinstance(run.task, RephrasedEvalSet):
        rephrased = run.task.rephrased(run.examples)
        rephrased_records: list[dict[str, Any]] = []
        for batch in run.batches(rephrased, label="eval (rephrased)"):
            rephrased_records.extend(sample_records(batch))
        result["rephrased"] = accuracy_block(rephrased_records)
        write_records(out / REPHRASED_SAMPLES_FILE, rephrased_records)
    write_results(out, result, records)
    result["output_dir"] = str(out)
    return result


def run_eval(cfg: NemoAzrConfig) -> dict[str, Any]:
    """Evaluate per the run's workflow; returns what ``metrics.json`` holds (+ ``output_dir``)."""
    from nemo_azr.evaluation.rlcr import run_calibration_eval
    from nemo_azr.rlcr.workflows import RLCR_WORKFLOWS

    workflow = cfg.rollout.workflow
    if workflow == "azr":
        from nemo_azr.evaluation.selfplay import run_selfplay_eval

        return run_selfplay_eval(cfg)
    if workflow not in (*ACCURACY_WORKFLOWS, *RLCR_WORKFLOWS):
        raise ConfigError(
            f"nemo-azr eval scores single-turn, RLCR and self-play (azr) workflows; rollout.workflow={workflow!r} "
            f"is not one of {', '.join((*ACCURACY_WORKFLOWS, *RLCR_WORKFLOWS, 'azr'))}"
        )
    run = EvalRun(cfg)
    return run_calibration_eval(run) if workflow in RLCR_WORKFLOWS else run_accuracy_eval(run)
