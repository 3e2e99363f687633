"""The requeue status survives a failing interpreter teardown. After a run's checkpoint, a library's
native thread can abort the process at exit (W&B's client with its service killed by the same
SIGTERM: SIGABRT, exit -6), and a SLURM script keyed on 75 would not requeue it. The entry point
(``python -m nemo_azr`` / the ``nemo-azr`` script) exits 75 without the teardown; other statuses
keep it. The abort is injected as an exit hook, from a ``sitecustomize`` module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from nemo_azr.trainer.preemption import EXIT_PREEMPTED

ABORT_AT_EXIT = "import atexit, os\natexit.register(os.abort)\n"


def _train(tiny_cache, tiny_model_path, tmp_path, out, *extra):
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(ABORT_AT_EXIT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hooks), os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable, "-m", "nemo_azr", "train", f"model.tiny.cache_dir={tiny_cache}", "logger=quiet",
        f"trainer.output_dir={out}", "sft_warmup.steps=0", "data.prompts_per_step=2",
        "generation.n_samples=2", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_requeue_status_survives_an_abort_at_exit(tiny_cache, tiny_model_path, tmp_path):
    out = tmp_path / "run"
    paused = _train(
        tiny_cache, tiny_model_path, tmp_path, out, "trainer.max_steps=2", "trainer.max_steps_per_run=1"
    )
    assert paused.returncode == EXIT_PREEMPTED, paused.stderr[-3000:]
    assert "paused at step 1" in paused.stdout  # printed before the teardown is skipped: flushed
    assert (out / "checkpoints" / "step_1" / "COMPLETE").is_file()

    # The injected hook really aborts a teardown that runs: the completing run (status 0) keeps it.
    done = _train(tiny_cache, tiny_model_path, tmp_path, out, "trainer.max_steps=2")
    assert "completed at step 2" in done.stdout, done.stderr[-3000:]
    assert done.returncode == -signal.SIGABRT
