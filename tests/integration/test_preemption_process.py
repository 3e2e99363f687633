"""SIGTERM to the whole job step, as slurmstepd sends it, with the decode loop in its own process
(rollout.async_generation=process): the generation process must not die before the trainer has
checkpointed; the run exits 75 with its checkpoint and no traceback, and leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil

from nemo_azr.trainer.metrics import read_metrics
from nemo_azr.trainer.preemption import EXIT_PREEMPTED


def _records(path):
    try:
        return read_metrics(path)
    except (FileNotFoundError, ValueError):
        return []


def test_sigterm_to_the_process_group_checkpoints_and_exits_75(tiny_cache, tiny_model_path, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "nemo_azr", "train",
        f"model.tiny.cache_dir={tiny_cache}", f"trainer.output_dir={out}", "trainer.max_steps=2000",
        "sft_warmup.steps=0", "data.prompts_per_step=2", "generation.n_samples=2", "logger=quiet",
        "rollout.async_rollout=true", "rollout.async_generation=process", "algorithm.off_policy_correction=tis",
        # lag 0 and long replies: the trainer spends most of its time waiting for the rollout
        "rollout.max_policy_lag=0", "generation.max_new_tokens=96",
    ]  # fmt: skip
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    try:
        # only a guard against a hung run: three steps took over 180 s with other jobs on the 2 cores
        deadline = time.monotonic() + 900
        while len(_records(out / "metrics.jsonl")) < 3:
            assert proc.poll() is None, err_file.read_text()[-3000:]
            assert time.monotonic() < deadline, "no training steps within 900 s"
            time.sleep(0.05)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the generation process is not running"
        os.killpg(proc.pid, signal.SIGTERM)  # every process of the step, the generation process included
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = err_file.read_text()
    assert proc.returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    saved = re.search(r"SIGTERM during training: saved (\S+), exiting for requeue", stderr)
    assert saved, stderr[-3000:]  # the checkpoint of the finished steps, not "nothing to save"
    step = int(saved.group(1).rsplit("step_", 1)[1])
    assert (out / "checkpoints" / f"step_{step}" / "COMPLETE").is_file()
    time.sleep(1.0)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
