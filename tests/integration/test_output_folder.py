"""Fault injection on the output folder, from outside, with the real command line:

- two runs on one ``trainer.output_dir``: the second is refused with one line naming the first, and
  the first goes on undisturbed (its config, checkpoints and metrics are its own);
- a file system that fills up during a checkpoint save (a tmpfs sized between two checkpoints, in a
  private mount namespace): one line naming the folder and the cause, exit 74, the older checkpoints
  intact and no partial folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from nemo_azr.errors import EXIT_STORAGE_FULL, EXIT_USAGE
from nemo_azr.trainer.checkpoint import is_complete
from nemo_azr.trainer.metrics import read_metrics
from nemo_azr.trainer.output_lock import LOCK_FILE
from nemo_azr.trainer.preemption import EXIT_PREEMPTED


def _cmd(tiny_cache, out, *extra):
    return [
        sys.executable, "-m", "nemo_azr", "train", f"model.tiny.cache_dir={tiny_cache}", "logger=quiet",
        f"trainer.output_dir={out}", "sft_warmup.steps=0", "data.prompts_per_step=2",
        "generation.n_samples=2", *extra,
    ]  # fmt: skip


def _wait_for(predicate, proc, what: str, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"the first run ended before {what}: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_second_run_on_the_same_folder_is_refused_and_the_first_goes_on(
    tiny_cache, tiny_model_path, tmp_path
):
    out = tmp_path / "run"
    first = subprocess.Popen(
        _cmd(tiny_cache, out, "seed=1", "trainer.max_steps=100000", "trainer.save_interval=0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        metrics = out / "metrics.jsonl"
        _wait_for(lambda: metrics.is_file() and metrics.stat().st_size > 0, first, "its first step")
        holder = json.loads((out / LOCK_FILE).read_text())
        assert holder["pid"] == first.pid

        second = subprocess.run(
            _cmd(tiny_cache, out, "seed=2", "trainer.max_steps=3"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == EXIT_USAGE, second.stderr[-2000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(
            f"nemo-azr: error: trainer.output_dir {out} is in use by another training run"
        )
        assert f"pid {first.pid} on host" in lines[0]
        assert first.poll() is None  # the first run was not disturbed
    finally:
        first.send_signal(signal.SIGTERM)  # it checkpoints and exits for requeue
        _, err = first.communicate(timeout=300)
    assert first.returncode == EXIT_PREEMPTED, err[-2000:]
    assert "seed: 1" in (out / "config.yaml").read_text().splitlines()  # its own config ...
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == list(range(1, len(steps) + 1))  # ... its own metrics, one run's rows in order
    (ckpt,) = [p for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")]
    assert is_complete(ckpt) and json.loads((ckpt / "trainer_state.json").read_text())["step"] == len(steps)
    assert not (out / LOCK_FILE).exists()  # released on the way out


def _folder_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_full_disk_during_a_checkpoint_save_is_one_line_and_exit_74(tiny_cache, tiny_model_path, tmp_path):
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode
    ):
        pytest.skip("needs a private mount namespace (unshare -rm) to mount a small tmpfs")
    # The size of one checkpoint of this run, measured on the real disk.
    probe = tmp_path / "probe"
    done = subprocess.run(
        _cmd(tiny_cache, probe, "trainer.max_steps=1"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    one_checkpoint = _folder_bytes(probe / "checkpoints" / "step_1")
    others = _folder_bytes(probe) - one_checkpoint
    # Room for two checkpoints and a half: the third save runs out of space part-way.
    size_kib = (others + int(2.5 * one_checkpoint)) // 1024 + 64

    mount, copy, rc_file, err_file = (tmp_path / n for n in ("mnt", "copy", "rc", "stderr"))
    mount.mkdir()
    train = " ".join(
        f"'{a}'"
        for a in _cmd(
            tiny_cache, mount / "run", "trainer.max_steps=6", "trainer.save_interval=1", "trainer.keep_last=0"
        )
    )
    script = (
        f"mount -t tmpfs -o size={size_kib}k tmpfs {mount} && "
        f"{{ {train} 2> {err_file}; echo $? > {rc_file}; cp -a {mount}/run {copy}; }}"
    )
    subprocess.run(["unshare", "-rm", "sh", "-c", script], check=True, timeout=600, env=os.environ)

    stderr = err_file.read_text()
    assert int(rc_file.read_text()) == EXIT_STORAGE_FULL, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0].startswith(
        f"nemo-azr: error: checkpoint step_3 could not be written to {mount}/run/checkpoints"
    )
    assert "no space left on device" in lines[0].lower()
    checkpoints = sorted(p.name for p in (copy / "checkpoints").iterdir())
    assert checkpoints == ["step_1", "step_2"]  # no partial folder, the older ones kept ...
    assert all(is_complete(copy / "checkpoints" / name) for name in checkpoints)  # ... and intact
