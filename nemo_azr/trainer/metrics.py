"""Per-step metrics sinks: console (progress bar + periodic line), JSONL file, W&B, TensorBoard.

Metric names are ``/``-namespaced (``reward/mean``, ``actor/pg_loss``, ``timing/step_s``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from nemo_azr.config.schema import LoggerConfig
from nemo_azr.trainer.samples import SAMPLES_FILE, format_samples

CONSOLE_KEYS = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "response/length_mean", "timing/step_s")
METRICS_FILE = "metrics.jsonl"
WANDB_SAMPLE_COLUMNS = ("step", "prompt", "response", "reward")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsLogger:
    def __init__(
        self,
        cfg: LoggerConfig,
        output_dir: Path,
        *,
        run_config: dict,
        total_steps: int,
        start_step: int,
        run_name: str,
    ) -> None:
        self.cfg = cfg
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.output_dir / METRICS_FILE
        self.samples_path = self.output_dir / SAMPLES_FILE
        if cfg.jsonl:
            truncate_jsonl(self.jsonl_path, start_step)
        if cfg.samples_per_step:
            truncate_jsonl(self.samples_path, start_step)
        self._bar = None
        if cfg.console:
            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc="train",
                dynamic_ncols=True,
                file=sys.stderr,
                disable=None,
            )
        self._wandb = None
        if cfg.wandb.enabled and cfg.wandb.mode != "disabled":
            self._wandb = self._init_wandb(run_config, run_name)
        self._tb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.output_dir / "tensorboard"))

    def _init_wandb(self, run_config: dict, run_name: str):
        import wandb

        wcfg = self.cfg.wandb
        id_file = self.output_dir / "wandb_run_id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        return wandb.init(
            project=wcfg.project,
            entity=wcfg.entity or None,
            name=wcfg.name or run_name,
            id=run_id,
            resume="allow",
            mode=wcfg.mode,
            dir=wcfg.dir or str(self.output_dir),
            config=run_config,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """``step`` is the 0-based index of the finished step."""
        record = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        if self.cfg.jsonl:
            with open(self.jsonl_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
        if self._bar is not None:
            shown = {
                k.split("/")[-1] if k != "reward/mean" else "reward": f"{metrics[k]:.3g}"
                for k in CONSOLE_KEYS[:2]
                if k in metrics
            }
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1)
            if (step + 1) % self.cfg.console_interval == 0:
                line = "  ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
                self._bar.write(f"step {step + 1}: {line}", file=sys.stderr)

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        """A step's sample texts: JSONL always, the console and W&B at the console interval."""
        if not records:
            return
        with open(self.samples_path, "a") as fh:
            for record in records:
                fh.write(json.dumps({k: _jsonable(v) for k, v in record.items()}, ensure_ascii=False) + "\n")
        if (step + 1) % self.cfg.console_interval:
            return
        if self.cfg.console_samples:
            self.message(f"step {step + 1} samples:\n{format_samples(records)}")
        if self._wandb is not None:
            import wandb

            rows = [[r.get(c) for c in WANDB_SAMPLE_COLUMNS] for r in records]
            self._wandb.log(
                {"samples": wandb.Table(columns=list(WANDB_SAMPLE_COLUMNS), data=rows)}, step=step
            )

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def truncate_jsonl(path: Path, step: int) -> None:
    """On resume, drop the records of steps at or after ``step`` (they will be logged again); a
    torn last line from a crash goes too."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", -1) < step:
                keep.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(x + "\n" for x in keep))


#: Metrics that measure the machine (wall time, speed, memory), not the run: they differ between two
#: runs that are otherwise identical (resume tests compare everything else).
MACHINE_METRIC_PREFIXES = ("timing/", "throughput/", "system/")


def without_machine_metrics(records: list[dict]) -> list[dict]:
    """The records with the machine-dependent metrics (:data:`MACHINE_METRIC_PREFIXES`) removed."""
    return [{k: v for k, v in r.items() if not k.startswith(MACHINE_METRIC_PREFIXES)} for r in records]


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file (for tests, plots and reports)."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
