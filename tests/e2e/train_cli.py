"""Run ``nemo-azr train`` as a user does (a subprocess) and read back its metrics."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

from nemo_azr.trainer.metrics import read_metrics

#: Only a guard against a hung run, never a speed check: a job of about a minute took over 15 minutes
#: with a SmolLM2 training beside it on the same 2 cores; CI's own limit is 90 minutes.
TIMEOUT_S = 2400


def train_cli(out: Path, *overrides: str, timeout: int = TIMEOUT_S) -> list[dict]:
    """``python -m nemo_azr train trainer.output_dir=out *overrides``; fails the test on a non-zero
    exit with the end of its stderr; returns the run's metrics records."""
    cmd = [sys.executable, "-m", "nemo_azr", "train", *overrides, f"trainer.output_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(out / "metrics.jsonl")


def reward_first_last(records: list[dict], window: int) -> tuple[float, float]:
    """Mean ``reward/mean`` of the first and of the last ``window`` steps."""
    rewards = [r["reward/mean"] for r in records]
    return statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
