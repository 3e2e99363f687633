"""The README's default job (tiny model, arithmetic, GRPO on CPU) visibly raises reward."""

import subprocess
import sys

import pytest

from nemo_azr.trainer.metrics import read_metrics

WINDOW = 10


@pytest.mark.e2e
def test_default_job_raises_reward(tiny_cache, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "nemo_azr",
        "train",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={out}",
        "logger.wandb.mode=offline",
        "logger.console=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out / "metrics.jsonl")
    rewards = [r["reward/mean"] for r in records]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.15, f"reward did not rise enough: first {first:.3f}, last {last:.3f}"
    assert (out / "checkpoints" / f"step_{len(records)}" / "COMPLETE").is_file()
    assert any((out / "wandb").glob("offline-run-*")), "W&B offline run folder missing"
