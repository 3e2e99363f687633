"""Per-step metrics sinks: console (progress bar + periodic line), JSONL file, W&B, TensorBoard,
and the sample texts (samples.jsonl, a W&B table).

Metric names are ``/``-namespaced (``reward/mean``, ``actor/pg_loss``, ``timing/step_s``).

Every sink fails soft: a sink that raises (at start, on a log call or at close) is switched off for
the rest of the run with one warning line on stderr, and the records that follow carry
``logger/failed_sinks`` (how many are off). Logging never ends a run, and never stands between a
preemption signal and its checkpoint (the trainer saves first, then logs).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from nemo_azr.config.schema import LoggerConfig
from nemo_azr.trainer.samples import SAMPLES_FILE, format_samples
from nemo_azr.utils.atomic_io import atomic_write_text, rewrite_lines

CONSOLE_KEYS = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "response/length_mean", "timing/step_s")
METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_run_id.txt"
WANDB_SAMPLE_COLUMNS = ("step", "prompt", "response", "reward")
FAILED_SINKS_KEY = "logger/failed_sinks"
SINKS = ("console", "jsonl", "wandb", "tensorboard", "samples")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def wandb_environment(mode: str) -> dict[str, str]:
    """The environment W&B must see before it starts its service process. ``wandb.init(mode=...)``
    alone is not enough: an offline run whose environment lacks ``WANDB_MODE`` still resolves the
    W&B host (a DNS lookup, seconds of delay where the host does not answer)."""
    return {"WANDB_MODE": mode}


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
        #: sink name -> the error that switched it off
        self.failed: dict[str, str] = {}
        self._saved_env: dict[str, str | None] = {}
        if cfg.jsonl:
            self._call("jsonl", truncate_jsonl, self.jsonl_path, start_step)
        if cfg.samples_per_step:
            self._call("samples", truncate_jsonl, self.samples_path, start_step)
        self._bar = None
        if cfg.console:
            self._bar = self._call(
                "console",
                tqdm,
                total=total_steps,
                initial=start_step,
                desc="train",
                dynamic_ncols=True,
                file=sys.stderr,
                disable=None,
            )
        self._wandb = None
        if cfg.wandb.enabled and cfg.wandb.mode != "disabled":
            self._wandb = self._call("wandb", self._init_wandb, run_config, run_name)
        self._tb = None
        if cfg.tensorboard:
            self._tb = self._call("tensorboard", self._init_tensorboard)
        self._beat_lock = threading.Lock()
        self._beat: tuple[int, float, threading.Timer] | None = None  # (step, start, timer)

    # --- heartbeat -------------------------------------------------------------------------------
    def step_started(self, step: int) -> None:
        """Step ``step`` (1-based, as logged) begins: a "still running" line every ``heartbeat_s``
        until it is logged."""
        if not (self.cfg.console and self.cfg.heartbeat_s > 0):
            return
        with self._beat_lock:
            self._cancel_beat()
            self._schedule_beat(step, time.monotonic())

    def _schedule_beat(self, step: int, start: float) -> None:
        timer = threading.Timer(self.cfg.heartbeat_s, self._heartbeat, (step, start))
        timer.daemon = True
        self._beat = (step, start, timer)
        timer.start()

    def _cancel_beat(self) -> None:
        if self._beat is not None:
            self._beat[2].cancel()
            self._beat = None

    def _heartbeat(self, step: int, start: float) -> None:
        with self._beat_lock:
            if self._beat is None or self._beat[0] != step:  # logged meanwhile: nothing to say
                return
            minutes, seconds = divmod(int(time.monotonic() - start), 60)
            self.message(f"step {step}: still running ({minutes}m {seconds:02d}s)")
            self._schedule_beat(step, start)

    # --- fail-soft plumbing ----------------------------------------------------------------------
    def _active(self, sink: str) -> bool:
        return sink not in self.failed

    def _call(self, sink: str, fn, *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)``, or None once ``sink`` has failed; an error switches it off."""
        if sink in self.failed:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any sink error: the run goes on without it
            self._disable(sink, exc)
            return None

    def _disable(self, sink: str, exc: BaseException) -> None:
        self.failed[sink] = _first_line(exc)
        _warn(
            f"nemo-azr: warning: the {sink} metrics sink failed ({self.failed[sink]}); "
            "it is off for the rest of this run"
        )
        if sink == "wandb":
            self._abandon_wandb()
        elif sink == "console" and self._bar is not None:
            bar, self._bar = self._bar, None
            with contextlib.suppress(Exception):
                bar.close()
        elif sink == "tensorboard" and self._tb is not None:
            tb, self._tb = self._tb, None
            with contextlib.suppress(Exception):
                tb.close()

    # --- W&B / TensorBoard -----------------------------------------------------------------------
    def _init_wandb(self, run_config: dict, run_name: str):
        wcfg = self.cfg.wandb
        # Before wandb is imported and starts its service (which reads them from the environment).
        env = {**wandb_environment(wcfg.mode), "WANDB_SILENT": os.environ.get("WANDB_SILENT", "true")}
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        import wandb

        id_file = self.output_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else ""
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            atomic_write_text(id_file, run_id)
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

    def _abandon_wandb(self) -> None:
        """A failed W&B run (e.g. its service process was killed along with the job): finish and tear
        down what can be, quietly, so wandb's exit hook does not print a traceback at exit."""
        run, self._wandb = self._wandb, None
        if run is not None:
            with contextlib.suppress(Exception, SystemExit):
                run.finish()
        wandb = sys.modules.get("wandb")
        if wandb is not None and hasattr(wandb, "teardown"):
            with contextlib.suppress(Exception, SystemExit):
                wandb.teardown()

    def _init_tensorboard(self):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.output_dir / "tensorboard"))

    # --- logging ---------------------------------------------------------------------------------
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """``step`` is the finished step's number, counted from 1: the number of updates done, the N
        of checkpoint ``step_N`` (one numbering for the console, metrics.jsonl, samples, W&B and
        TensorBoard; decision 157)."""
        with self._beat_lock:
            self._cancel_beat()
        if self.failed:
            metrics = {**metrics, FAILED_SINKS_KEY: float(len(self.failed))}
        record = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        if self.cfg.jsonl:
            self._call("jsonl", _append_lines, self.jsonl_path, [json.dumps(record)])
        if self._wandb is not None:
            self._call("wandb", self._wandb.log, metrics, step=step)
        if self._tb is not None:
            self._call("tensorboard", self._log_tensorboard, step, metrics)
        if self._bar is not None:
            self._call("console", self._log_console, step, metrics)

    def _log_tensorboard(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._tb.add_scalar(k, v, step)

    def _log_console(self, step: int, metrics: dict[str, float]) -> None:
        shown = {
            k.split("/")[-1] if k != "reward/mean" else "reward": f"{metrics[k]:.3g}"
            for k in CONSOLE_KEYS[:2]
            if k in metrics
        }
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)
        if step % self.cfg.console_interval == 0:
            line = "  ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            self._bar.write(f"step {step}: {line}", file=sys.stderr)

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        """A step's sample texts: JSONL always, the console and W&B at the console interval."""
        if not records:
            return
        lines = [json.dumps({k: _jsonable(v) for k, v in r.items()}, ensure_ascii=False) for r in records]
        self._call("samples", _append_lines, self.samples_path, lines)
        if step % self.cfg.console_interval:
            return
        if self.cfg.console_samples:
            self.message(f"step {step} samples:\n{format_samples(records)}")
        if self._wandb is not None:
            self._call("wandb", self._log_wandb_samples, step, records)

    def _log_wandb_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        import wandb

        rows = [[r.get(c) for c in WANDB_SAMPLE_COLUMNS] for r in records]
        self._wandb.log({"samples": wandb.Table(columns=list(WANDB_SAMPLE_COLUMNS), data=rows)}, step=step)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._call("console", self._bar.write, text, file=sys.stderr)
            if self._active("console"):
                return
        _warn(text)

    def close(self) -> None:
        with self._beat_lock:
            self._cancel_beat()
        if self._bar is not None:
            self._call("console", self._bar.close)
        if self._wandb is not None:
            self._call("wandb", self._wandb.finish)
        if self._tb is not None:
            self._call("tensorboard", self._tb.close)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()


def _warn(text: str) -> None:
    """One line on stderr; a broken stderr is not worth an exception."""
    with contextlib.suppress(Exception):
        print(text, file=sys.stderr, flush=True)


def _append_lines(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def truncate_jsonl(path: Path, step: int) -> None:
    """On resume from checkpoint ``step_<step>``, drop the records of the steps after it (they will be
    logged again); a torn last line from a crash goes too. The file is replaced atomically (a crash
    leaves the old one), and left untouched when nothing is dropped."""
    if not path.exists():
        return

    def keep(line: str) -> bool:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return False
        return isinstance(record, dict) and record.get("step", -1) <= step

    rewrite_lines(path, keep)


#: Metrics that measure the machine (wall time, speed, memory) or its surroundings (a logging sink
#: that failed), not the run: they differ between two runs that are otherwise identical (resume
#: tests compare everything else).
MACHINE_METRIC_PREFIXES = ("timing/", "throughput/", "system/", "logger/")
MACHINE_METRICS = ("async/wait_s",)  # the trainer's wait for the producer: wall time too


def without_machine_metrics(records: list[dict]) -> list[dict]:
    """The records with the machine-dependent metrics (:data:`MACHINE_METRIC_PREFIXES`,
    :data:`MACHINE_METRICS`) removed."""
    return [
        {k: v for k, v in r.items() if not k.startswith(MACHINE_METRIC_PREFIXES) and k not in MACHINE_METRICS}
        for r in records
    ]


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file (for tests, plots and reports)."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
