"""SIGTERM with W&B on, as on a SLURM preemption: slurmstepd terminates every process of the job step,
W&B's service process included, so the trainer's next W&B call fails. The checkpoint must still be
written (it comes before any logging), the run exits 75 without a traceback, and a resume finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from nemo_azr.trainer.metrics import read_metrics
from nemo_azr.trainer.preemption import EXIT_PREEMPTED

pytest.importorskip("wandb")


def _cmd(tiny_cache, out, max_steps):
    return [
        sys.executable,
        "-m",
        "nemo_azr",
        "train",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={out}",
        f"trainer.max_steps={max_steps}",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        "generation.n_samples=2",
        "logger.console=false",
        "logger.wandb.enabled=true",
        "logger.wandb.mode=offline",
    ]


def _env():
    # As a user's shell: the mode comes from the config only, and no W&B service of this test
    # process (an in-process test may have started one) is handed down to the trainer.
    return {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}


def _records(path):
    try:
        return read_metrics(path)
    except (FileNotFoundError, ValueError):  # not there yet, or a line being written
        return []


def _alive(p: psutil.Process) -> bool:
    """Running, not a zombie (the trainer, its parent, reaps it only later)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_with_wandb_service_killed_still_checkpoints(tiny_cache, tiny_model_path, tmp_path):
    out = tmp_path / "run"
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            _cmd(tiny_cache, out, 500), stdout=subprocess.PIPE, stderr=err, text=True, env=_env()
        )
    try:
        deadline = time.monotonic() + 180
        while len(_records(out / "metrics.jsonl")) < 2:  # training, with W&B logging every step
            assert proc.poll() is None, err_file.read_text()[-3000:]
            assert time.monotonic() < deadline, "no training steps within 180 s"
            time.sleep(0.05)
        services = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if p.name().startswith("wandb-core")
        ]
        assert services, "W&B's service process not found"
        for p in services:  # what slurmstepd does to every process of the step...
            p.send_signal(signal.SIGTERM)
        while any(_alive(p) for p in services):
            assert time.monotonic() < deadline, "W&B's service process outlived SIGTERM"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # ...the trainer included
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err_file.read_text()
    assert proc.returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("the wandb metrics sink failed") == 1, stderr[-3000:]
    step = int(stdout.split("preempted at step ")[1].split(";")[0])
    ckpt = out / "checkpoints" / f"step_{step}"
    assert (ckpt / "COMPLETE").is_file()
    assert f"nemo-azr: SIGTERM during training: saved {ckpt}, exiting for requeue" in stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, step + 1))

    # The requeued job resumes from that checkpoint (W&B on again, a fresh service) and finishes.
    done = subprocess.run(
        _cmd(tiny_cache, out, step + 1), capture_output=True, text=True, env=_env(), timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {ckpt}" in done.stderr and f"completed at step {step + 1}" in done.stdout
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, step + 2))
