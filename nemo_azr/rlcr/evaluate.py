"""``nemo-azr eval``: run the configured RLCR rollout on the task's prompts (seeded, no training) and
measure calibration: accuracy, ECE, Brier, AUROC, mean confidence; ``<out>/metrics.json`` and a
reliability diagram ``<out>/reliability.png``.

Calibration points are the rows with a confidence turn (two-turn: each confidence of each answer;
single-turn: each response), labelled with their answer's accuracy. A confidence that does not
parse is left out of the calibration numbers and counted in ``confidence_parse_fail_rate``.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.errors import ConfigError
from nemo_azr.rlcr.calibration import calibration_metrics, plot_reliability_diagram, reliability_bins
from nemo_azr.rlcr.common import ANSWER_CORRECT, CONFIDENCE, HAS_CONFIDENCE
from nemo_azr.rlcr.workflows import RLCR_WORKFLOWS

CHECKPOINT_DIR = "checkpoints"  # same folder name as the trainer's
METRICS_FILE = "metrics.json"
DIAGRAM_FILE = "reliability.png"
EVAL_SEED_SALT = 104729


def resolve_eval_model(cfg: NemoAzrConfig) -> tuple[Path, str]:
    """The model folder to evaluate and a description of where it came from."""
    from nemo_azr.models.tiny import resolve_model_path
    from nemo_azr.trainer.checkpoint import Checkpointer

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
        return latest / "model", str(latest)
    folder = Path(choice).expanduser()
    for candidate in (folder / "model", folder):
        if (candidate / "config.json").is_file():
            return candidate, str(folder)
    raise ConfigError(
        f"eval.checkpoint={choice!r} is neither a step_N checkpoint nor a model folder (no config.json)"
    )


def _eval_config(cfg: NemoAzrConfig) -> NemoAzrConfig:
    """The run's config with the eval sample counts in place of the training ones."""
    out = copy.deepcopy(cfg)
    out.rlcr.num_generations_answer = cfg.eval.answers_per_prompt
    out.rlcr.num_generations_confidence = cfg.eval.confidences_per_answer
    out.generation.n_samples = cfg.eval.answers_per_prompt
    return out


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def run_eval(cfg: NemoAzrConfig) -> dict[str, Any]:
    """Evaluate and write the JSON + PNG; returns the JSON's content."""
    import torch
    from transformers import AutoModelForCausalLM

    import nemo_azr.rollout  # noqa: F401  (registers generation backends)
    from nemo_azr.models.tiny import load_tokenizer
    from nemo_azr.registry import GENERATION_BACKENDS, WORKFLOWS
    from nemo_azr.rollout.hf_backend import sampling_from_config
    from nemo_azr.tasks import build_task
    from nemo_azr.trainer.seeding import seed_everything, step_seed

    if cfg.rollout.workflow not in RLCR_WORKFLOWS:
        raise ConfigError(
            f"nemo-azr eval measures RLCR calibration; rollout.workflow={cfg.rollout.workflow!r} is not one of "
            f"{', '.join(RLCR_WORKFLOWS)} (e.g. pass experiment=rlcr_two_turn)"
        )
    ev = cfg.eval
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    task = build_task(cfg.data)
    model_dir, source = resolve_eval_model(cfg)
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, cfg.model.dtype))
    eval_cfg = _eval_config(cfg)
    workflow = WORKFLOWS.get(cfg.rollout.workflow)(task, tokenizer, eval_cfg)
    backend_cls = GENERATION_BACKENDS.get(cfg.generation.backend)
    if getattr(backend_cls, "reads_policy_in_place", False):  # eval reads an HF export, not a policy
        backend_cls = GENERATION_BACKENDS.get("hf")
    backend = backend_cls(model, tokenizer, max_batch_size=cfg.generation.max_batch_size)
    sampling = sampling_from_config(eval_cfg.generation, greedy=ev.greedy)

    examples = list(task.examples)
    if ev.num_examples and ev.num_examples < len(examples):
        keep = sorted(random.Random(cfg.seed).sample(range(len(examples)), ev.num_examples))
        examples = [examples[i] for i in keep]

    answer_correct: list[float] = []
    points: list[tuple[float | None, float]] = []
    for chunk_index, start in enumerate(range(0, len(examples), ev.prompts_per_batch)):
        seed_everything(step_seed(cfg.seed, chunk_index, salt=EVAL_SEED_SALT))
        batch = workflow.run(
            examples[start : start + ev.prompts_per_batch], backend, sampling, step=chunk_index
        )
        for sample_type, acc, has_conf, conf in zip(
            batch[F.SAMPLE_TYPE], batch[ANSWER_CORRECT], batch[HAS_CONFIDENCE], batch[CONFIDENCE]
        ):
            if sample_type == SampleType.ANSWER.value:
                answer_correct.append(float(acc))
            if has_conf:
                points.append((conf, float(acc)))

    parsed = [(c, y) for c, y in points if c is not None]
    confs, labels = [c for c, _ in parsed], [y for _, y in parsed]
    metrics = calibration_metrics(confs, labels, n_bins=ev.n_bins)
    bins = reliability_bins(confs, labels, n_bins=ev.n_bins)
    result = {
        "checkpoint": source,
        "workflow": cfg.rollout.workflow,
        "num_prompts": len(examples),
        "num_answers": len(answer_correct),
        "num_confidences": len(points),
        "confidence_parse_fail_rate": (1 - len(parsed) / len(points)) if points else math.nan,
        "answer_accuracy": sum(answer_correct) / len(answer_correct) if answer_correct else math.nan,
        **metrics,
        "n_bins": ev.n_bins,
        "bins": bins,
    }
    result = {k: _json_value(v) for k, v in result.items()}
    out_dir = Path(ev.output_dir or Path(cfg.trainer.output_dir) / "eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / METRICS_FILE).write_text(json.dumps(result, indent=1) + "\n")
    title = f"{cfg.experiment_name}: ECE {_fmt(metrics['ece'])}, Brier {_fmt(metrics['brier'])}"
    plot_reliability_diagram(bins, out_dir / DIAGRAM_FILE, title=title)
    result["output_dir"] = str(out_dir)
    return result


def _fmt(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.3f}"
