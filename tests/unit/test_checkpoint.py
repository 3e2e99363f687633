import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nemo_azr.errors import CheckpointDamagedError, CheckpointError
from nemo_azr.trainer.checkpoint import Checkpointer, plan_resume, resolve_resume


def _write_files(n_bytes: int):
    def write(folder: Path) -> None:
        (folder / "a.bin").write_bytes(b"x" * n_bytes)
        (folder / "state.json").write_text("{}")

    return write


def test_save_publishes_complete_folder_and_prunes(tmp_path):
    ck = Checkpointer(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        ck.save(step, _write_files(10))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step_2", "step_3"]
    assert ck.latest().name == "step_3"
    assert (tmp_path / "step_3" / "COMPLETE").is_file()


def test_rotation_keeps_the_warmup_checkpoint(tmp_path):
    ck = Checkpointer(tmp_path, keep_last=2)
    for step in (0, 1, 2, 3, 4):
        ck.save(step, _write_files(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0", "step_3", "step_4"]


def test_latest_orders_numerically_and_ignores_incomplete(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.save(9, _write_files(1))
    ck.save(10, _write_files(1))
    (tmp_path / "step_11").mkdir()  # no marker: e.g. copied by hand, half-done
    (tmp_path / ".tmp-step_12-1-abc").mkdir()
    assert ck.latest().name == "step_10"


def test_resolve_resume_modes(tmp_path):
    assert resolve_resume("auto", tmp_path) is None
    ck = Checkpointer(tmp_path)
    ck.save(4, _write_files(1))
    assert resolve_resume("auto", tmp_path).name == "step_4"
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume(str(tmp_path / "step_4"), tmp_path).name == "step_4"
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "step_5"), tmp_path)
    (tmp_path / "step_6").mkdir()
    with pytest.raises(CheckpointError, match="not a complete"):
        resolve_resume(str(tmp_path / "step_6"), tmp_path)


def test_a_deleted_complete_marker_is_named_and_the_run_falls_back(tmp_path):
    ck = Checkpointer(tmp_path)
    for step in (2, 4):
        ck.save(step, _write_files(3))
    (tmp_path / "step_4" / "COMPLETE").unlink()
    plan = plan_resume("auto", tmp_path)
    assert plan.folder.name == "step_2" and [p.name for p in plan.skipped] == ["step_4"]
    assert plan.notes == [
        "resume: damaged checkpoint skipped: step_4 (its COMPLETE marker is missing); falling back to step_2"
    ]
    (tmp_path / "step_2" / "COMPLETE").unlink()  # none left intact: an error, not a fresh start
    with pytest.raises(
        CheckpointDamagedError, match=r"every checkpoint in .* is damaged: step_4 .* \| step_2"
    ):
        plan_resume("auto", tmp_path)


def test_failed_write_leaves_nothing(tmp_path):
    ck = Checkpointer(tmp_path)

    def boom(folder: Path) -> None:
        (folder / "x").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        ck.save(1, boom)
    assert list(tmp_path.iterdir()) == []


# A child process saves step 1, then starts saving step 2 and stops at ``phase`` (announcing it on
# stdout) so the parent can kill -9 it exactly there.
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from nemo_azr.trainer import checkpoint as C

    root, phase = sys.argv[1], sys.argv[2]
    ck = C.Checkpointer(root)

    def write(folder):
        (folder / "weights.bin").write_bytes(b"w" * 1_000_000)

    ck.save(1, write)

    def slow_write(folder):
        with open(folder / "weights.bin", "wb") as fh:
            fh.write(b"w" * 100_000)
            fh.flush()
            if phase == "writing":
                print("ready", flush=True); time.sleep(60)
            fh.write(b"w" * 900_000)

    real_rename = os.rename
    def rename(src, dst):
        if phase == "before-rename" and str(dst).endswith("step_2"):
            print("ready", flush=True); time.sleep(60)
        return real_rename(src, dst)
    C.os.rename = rename
    ck.save(2, slow_write)
    print("ready", flush=True)
    """
)


@pytest.mark.parametrize("phase", ["writing", "before-rename"])
def test_kill_9_during_save_never_yields_a_half_checkpoint(tmp_path, phase):
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), phase], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    ck = Checkpointer(tmp_path)
    latest = ck.latest()
    assert latest.name == "step_1"
    assert (latest / "weights.bin").stat().st_size == 1_000_000
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the killed save should have left its temp folder behind"
    ck.save(3, _write_files(1))  # the next save cleans stale temp folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_3"]
