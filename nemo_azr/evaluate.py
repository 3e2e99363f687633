"""``nemo-azr eval``: score a checkpoint (or the untrained model) on the held-out split, no training.

The run's own rollout workflow is used, so the prompts, answer parsing and rewards are exactly the
training ones: ``single_turn`` workflows report accuracy (the task's reward); RLCR workflows also
report calibration (ECE, Brier, AUROC, reliability diagram; :mod:`nemo_azr.rlcr.evaluate`).
Decoding is greedy by default (``eval.greedy``), so "before" and "after" are one deterministic
command each. Written to ``eval.output_dir`` (default ``<trainer.output_dir>/eval``):
``metrics.json`` and ``samples.jsonl`` (every prompt and response scored).
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"  # same folder name as the trainer's
METRICS_FILE = "metrics.json"
SAMPLES_FILE = "samples.jsonl"
EVAL_SEED_SALT = 104729
ACCURACY_WORKFLOWS = ("single_turn",)


def resolve_eval_model(cfg: NemoAzrConfig) -> tuple[Path, str]:
    """The model folder to evaluate and a description of where it came from."""
    from nemo_azr.models.tiny import resolve_model_path
    from nemo_azr.trainer.checkpoint import Checkpointer, is_complete

    choice = cfg.eval.checkpoint
    if choice == "model":
        return Path(resolve_model_path(cfg.model.path, cfg.model.tiny)), f"model.path={cfg.model.path}"
    if choice == "auto":
        root = Path(cfg.trainer.output_dir) / CHECKPOINT_DIR
        latest = Checkpointer(root).latest()
        if latest is None:
            raise ConfigError(
                f"eval.checkpoint=auto: no complete checkpoint in {str(root)!r}; train first, or set "
                "eval.checkpoint=/path/to/step_N (or =model to evaluate model.path)"
            )
        _verify(latest, "eval.checkpoint=auto: the newest checkpoint")
        return latest / "model", str(latest)
    folder = Path(choice).expanduser()
    if is_complete(folder):  # a trainer checkpoint: its files must match the manifest
        _verify(folder, "eval.checkpoint: checkpoint")
    for candidate in (folder / "model", folder):
        if (candidate / "config.json").is_file():
            return candidate, str(folder)
    raise ConfigError(
        f"eval.checkpoint={choice!r} is neither a step_N checkpoint nor a model folder (no config.json)"
    )


def _verify(folder: Path, what: str) -> None:
    """A damaged checkpoint is one clear error: scores of damaged weights would be meaningless, and
    silently scoring an older checkpoint would misreport which one was evaluated."""
    from nemo_azr.errors import CheckpointDamagedError
    from nemo_azr.trainer.checkpoint import verify_checkpoint

    try:
        warning = verify_checkpoint(folder)
    except CheckpointDamagedError as exc:
        raise ConfigError(
            f"{what} {folder} is damaged: {exc.problems}; pass an intact one as eval.checkpoint=PATH"
        ) from None
    if warning:
        print(f"nemo-azr: warning: {warning}", file=sys.stderr)


def eval_config(cfg: NemoAzrConfig) -> NemoAzrConfig:
    """The run's config with the eval sample counts in place of the training ones (one answer and
    one confidence per prompt when greedy: more would be copies)."""
    out = copy.deepcopy(cfg)
    answers = 1 if cfg.eval.greedy else cfg.eval.answers_per_prompt
    out.rlcr.num_generations_answer = answers
    out.rlcr.answer_decoding = "sample"  # eval decoding follows eval.greedy, not the training turn's
    out.rlcr.num_generations_confidence = 1 if cfg.eval.greedy else cfg.eval.confidences_per_answer
    out.generation.n_samples = answers
    return out


class EvalRun:
    """Model, tokenizer, task (held-out split), workflow, backend and sampling of one evaluation."""

    def __init__(self, cfg: NemoAzrConfig) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        import nemo_azr.rlcr  # noqa: F401  (registers the RLCR workflows)
        import nemo_azr.rollout  # noqa: F401  (registers generation backends)
        from nemo_azr.models.tiny import load_tokenizer
        from nemo_azr.registry import GENERATION_BACKENDS, WORKFLOWS
        from nemo_azr.rollout.hf_backend import backend_kwargs, sampling_from_config
        from nemo_azr.tasks import build_task

        self.cfg = cfg
        if cfg.trainer.num_threads > 0:
            torch.set_num_threads(cfg.trainer.num_threads)
        self.task = build_task(cfg.data, split="eval")
        self.model_dir, self.source = resolve_eval_model(cfg)
        self.tokenizer = load_tokenizer(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(
            str(self.model_dir), dtype=getattr(torch, cfg.model.dtype)
        )
        self.eval_cfg = eval_config(cfg)
        self.workflow = WORKFLOWS.get(cfg.rollout.workflow)(self.task, self.tokenizer, self.eval_cfg)
        backend_cls = GENERATION_BACKENDS.get(cfg.generation.backend)
        if getattr(backend_cls, "reads_policy_in_place", False):  # eval reads an HF folder, not a policy
            backend_cls = GENERATION_BACKENDS.get("hf")
        self.backend = backend_cls(model, self.tokenizer, **backend_kwargs(cfg.generation))
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

    def batches(self) -> Iterator[Batch]:
        """The workflow's scored batches over the examples, ``eval.prompts_per_batch`` at a time."""
        from nemo_azr.trainer.rewards import score_batch
        from nemo_azr.trainer.seeding import seed_everything, step_seed

        per_batch = self.cfg.eval.prompts_per_batch
        total = len(self.examples)
        for index, start in enumerate(range(0, total, per_batch)):
            seed_everything(step_seed(self.cfg.seed, index, salt=EVAL_SEED_SALT))
            begin = time.perf_counter()
            batch = self.workflow.run(
                self.examples[start : start + per_batch], self.backend, self.sampling, step=index
            )
            self.seconds += time.perf_counter() - begin
            self.generated_tokens += int(batch[F.LOSS_MASK].sum()) if len(batch) else 0
            if F.REWARDS not in batch.tensors:
                batch = score_batch(batch, self.task, errors="raise")
            print(f"eval: {min(start + per_batch, total)}/{total} prompts", flush=True)
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
        out = Path(self.cfg.eval.output_dir or Path(self.cfg.trainer.output_dir) / "eval")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"eval.output_dir {str(out)!r} cannot be created: {exc}") from None
        return out


def sample_records(batch: Batch, extra_keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One record per row: prompt id, question, response, reward (+ ``extra_keys`` of the meta)."""
    records = []
    examples = batch.meta.get("example", [None] * len(batch))
    for i in range(len(batch)):
        record = {
            "prompt_id": batch[F.PROMPT_ID][i],
            "question": batch[F.PROMPT_TEXT][i],
            "gold": getattr(examples[i], "answer", None),
            "response": batch[F.RESPONSE_TEXT][i],
            "reward": float(batch[F.REWARDS][i]),
            "finish_reason": batch.meta.get("finish_reason", [None] * len(batch))[i],
        }
        kind = example_kind(examples[i])
        if kind is not None:
            record["kind"] = kind
        for key in extra_keys:
            if key in batch.meta:
                record[key] = batch.meta[key][i]
        records.append(record)
    return records


def example_kind(example: Any) -> str | None:
    """The question kind a task records in ``Example.meta["kind"]`` (synthetic_qa), else None."""
    meta = getattr(example, "meta", None) or {}
    kind = meta.get("kind")
    return None if kind is None else str(kind)


def write_results(out: Path, result: dict[str, Any], records: list[dict[str, Any]]) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.items()}
    (out / METRICS_FILE).write_text(json.dumps(clean, indent=1) + "\n")
    with open(out / SAMPLES_FILE, "w") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def run_accuracy_eval(run: EvalRun) -> dict[str, Any]:
    """Accuracy of a single-turn workflow: the mean of the task's 0/1 reward over the responses."""
    records: list[dict[str, Any]] = []
    for batch in run.batches():
        records.extend(sample_records(batch))
    rewards = [r["reward"] for r in records]
    lengths_capped = sum(r["finish_reason"] == "length" for r in records)
    result = {
        **run.summary(),
        "num_responses": len(records),
        "accuracy": sum(rewards) / len(rewards) if rewards else math.nan,
        "truncated_frac": lengths_capped / len(records) if records else math.nan,
    }
    out = run.output_dir()
    write_results(out, result, records)
    result["output_dir"] = str(out)
    return result


def run_eval(cfg: NemoAzrConfig) -> dict[str, Any]:
    """Evaluate per the run's workflow; returns what ``metrics.json`` holds (+ ``output_dir``)."""
    from nemo_azr.rlcr.evaluate import run_calibration_eval
    from nemo_azr.rlcr.workflows import RLCR_WORKFLOWS

    workflow = cfg.rollout.workflow
    if workflow not in (*ACCURACY_WORKFLOWS, *RLCR_WORKFLOWS):
        raise ConfigError(
            f"nemo-azr eval scores single-turn and RLCR workflows; rollout.workflow={workflow!r} is not one of "
            f"{', '.join((*ACCURACY_WORKFLOWS, *RLCR_WORKFLOWS))} (self-play is measured by its training "
            "metrics: nemo-azr plot-selfplay)"
        )
    run = EvalRun(cfg)
    return run_calibration_eval(run) if workflow in RLCR_WORKFLOWS else run_accuracy_eval(run)
