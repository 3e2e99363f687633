"""What every ``nemo-azr eval`` shares: the evaluated model, the output folder, the written records.

Kept apart from :mod:`nemo_azr.evaluation.run` (which dispatches per workflow) so the workflow-specific
evaluations (:mod:`nemo_azr.evaluation.rlcr`, :mod:`nemo_azr.evaluation.selfplay`) import it without a
circle.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import ConfigError
from nemo_azr.trainer.checkpoint import CHECKPOINT_DIR
from nemo_azr.utils.atomic_io import atomic_write_text

METRICS_FILE = "metrics.json"
SAMPLES_FILE = "samples.jsonl"


def resolve_eval_model(
    cfg: NemoAzrConfig, choice: str | None = None, key: str = "eval.checkpoint"
) -> tuple[Path, str]:
    """The model folder to evaluate (``choice``, default ``eval.checkpoint``) and a description of
    where it came from; errors name ``key``, the setting ``choice`` came from."""
    from nemo_azr.models.tiny import resolve_model_path
    from nemo_azr.trainer.checkpoint import Checkpointer, is_complete

    choice = cfg.eval.checkpoint if choice is None else choice
    if choice == "model":
        return Path(resolve_model_path(cfg.model.path, cfg.model.tiny)), f"model.path={cfg.model.path}"
    if choice == "auto":
        root = Path(cfg.trainer.output_dir) / CHECKPOINT_DIR
        latest = Checkpointer(root).latest()
        if latest is None:
            raise ConfigError(
                f"{key}=auto: no complete checkpoint in {str(root)!r}; train first, or set "
                f"{key}=/path/to/step_N (or =model to evaluate model.path)"
            )
        _verify(latest, f"{key}=auto: the newest checkpoint", key)
        return latest / "model", str(latest)
    folder = Path(choice).expanduser()
    if is_complete(folder):  # a trainer checkpoint: its files must match the manifest
        _verify(folder, f"{key}: checkpoint", key)
    for candidate in (folder / "model", folder):
        if (candidate / "config.json").is_file():
            return candidate, str(folder)
    raise ConfigError(f"{key}={choice!r} is neither a step_N checkpoint nor a model folder (no config.json)")


def _verify(folder: Path, what: str, key: str) -> None:
    """A damaged checkpoint is one clear error: scores of damaged weights would be meaningless, and
    silently scoring an older checkpoint would misreport which one was evaluated."""
    from nemo_azr.errors import CheckpointDamagedError
    from nemo_azr.trainer.checkpoint import verify_checkpoint

    try:
        warning = verify_checkpoint(folder)
    except CheckpointDamagedError as exc:
        raise ConfigError(
            f"{what} {folder} is damaged: {exc.problems}; pass an intact one as {key}=PATH"
        ) from None
    if warning:
        print(f"nemo-azr: warning: {warning}", file=sys.stderr)


@dataclass
class EvalModel:
    """The evaluated model's folder, where it came from, its tokenizer and a generation backend."""

    model_dir: Path
    source: str
    tokenizer: Any
    backend: Any


def load_eval_model(cfg: NemoAzrConfig, choice: str | None = None, key: str = "eval.checkpoint") -> EvalModel:
    """Resolve ``eval.checkpoint`` (or ``choice``, set by ``key``) and load it behind the run's
    generation backend (the hf one when the run's backend reads a live policy in place: eval reads
    an HF folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    import nemo_azr.rollout  # noqa: F401  (registers generation backends)
    from nemo_azr.models.tiny import load_tokenizer
    from nemo_azr.registry import GENERATION_BACKENDS
    from nemo_azr.rollout.hf_backend import backend_kwargs

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    model_dir, source = resolve_eval_model(cfg, choice, key)
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, cfg.model.dtype))
    backend_cls = GENERATION_BACKENDS.get(cfg.generation.backend)
    if backend_cls.reads_policy_in_place:
        backend_cls = GENERATION_BACKENDS.get("hf")
    return EvalModel(
        model_dir, source, tokenizer, backend_cls(model, tokenizer, **backend_kwargs(cfg.generation))
    )


def eval_output_dir(cfg: NemoAzrConfig) -> Path:
    """``eval.output_dir`` (default ``<trainer.output_dir>/eval``), created."""
    out = Path(cfg.eval.output_dir or Path(cfg.trainer.output_dir) / "eval")
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


def _finite(value: Any) -> Any:
    """NaN/inf as null (JSON has neither), also inside nested blocks (``by_kind``, ``rephrased``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "w") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_results(out: Path, result: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """The samples, then the metrics, atomically: an evaluation with a ``metrics.json`` is complete
    (scripts that resume a series of evaluations skip those)."""
    write_records(out / SAMPLES_FILE, records)
    atomic_write_text(out / METRICS_FILE, json.dumps(_finite(result), indent=1) + "\n")
