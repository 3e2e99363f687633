"""One run per output folder: a second process is refused with the first one named; a lock left by
a process killed with SIGKILL is taken over and named; a process's trainers share their lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from nemo_azr.trainer.output_lock import (
    LOCK_FILE,
    OutputFolderInUseError,
    acquire_output_lock,
    release_output_lock,
)

HOLDER = textwrap.dedent(
    """
    import sys, time
    from nemo_azr.trainer.output_lock import acquire_output_lock
    acquire_output_lock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def holder(tmp_path):
    """A process that holds ``tmp_path/run``'s lock until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_process_is_refused_naming_the_first(tmp_path, holder):
    folder = tmp_path / "run"
    with pytest.raises(OutputFolderInUseError) as err:
        acquire_output_lock(folder)
    message = str(err.value)
    assert "\n" not in message
    assert f"{folder.resolve()} is in use by another training run" in message
    assert f"pid {holder.pid} on host {socket.gethostname()}" in message
    assert "choose another trainer.output_dir" in message


def test_a_lock_left_by_a_killed_process_is_taken_over_and_named(tmp_path, holder):
    folder = tmp_path / "run"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (folder / LOCK_FILE).is_file()  # kill -9 leaves the file; the kernel dropped the lock
    note = acquire_output_lock(folder)
    try:
        assert note is not None and f"pid {holder.pid}" in note and "no longer runs" in note
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        release_output_lock(folder)
    assert not (folder / LOCK_FILE).exists()  # a clean release leaves nothing behind


def test_trainers_of_one_process_share_the_lock_and_the_last_release_frees_it(tmp_path):
    folder = tmp_path / "run"
    assert acquire_output_lock(folder) is None
    assert acquire_output_lock(folder) is None  # re-entrant within the process
    release_output_lock(folder)
    assert (folder / LOCK_FILE).is_file()  # still held by the first
    probe = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(600)", ""), str(folder)],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "OutputFolderInUseError" in probe.stderr
    release_output_lock(folder)
    assert not (folder / LOCK_FILE).exists()
    free = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(600)", ""), str(folder)],
        capture_output=True,
        text=True,
    )
    assert free.returncode == 0 and free.stdout.strip() == "locked", free.stderr
