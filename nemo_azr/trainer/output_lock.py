"""One training run per output folder: a lock file that names the run holding it.

Two runs writing one ``trainer.output_dir`` would overwrite each other's checkpoints and config and
interleave their metrics. The trainer takes an exclusive ``flock`` on ``<output_dir>/.nemo_azr.lock``
before writing anything and keeps it until its run ends; the kernel drops the lock when the process
dies, however it dies (``kill -9``, a node's OOM killer), so a lock is never stale in the kernel's
eyes. The file's text (host, pid, start time) is only for people: a second run names the first, and a
run that finds the text of one that died without cleaning up says so.

``flock`` rather than an ``O_EXCL`` file: a file alone cannot tell a dead run from a live one on
another host, and Slurm requeues a preempted job onto any node. Lustre, GPFS and NFSv4 honour flock
across nodes when mounted with it (Lustre: ``-o flock``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from nemo_azr.errors import NemoAzrError

LOCK_FILE = ".nemo_azr.lock"


class OutputFolderInUseError(NemoAzrError):
    """Another live run holds the output folder's lock."""


class _HeldLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.holders = path, fd, 1


_held: dict[Path, _HeldLock] = {}  # per process: trainers of one process share their folder's lock


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}"


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        holder = json.loads(raw.decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


def acquire_output_lock(folder: Path, *, key: str = "trainer.output_dir") -> str | None:
    """Take ``folder``'s run lock for this process (re-entrant: a second trainer of the same process
    shares it). Raises :class:`OutputFolderInUseError` naming the run that holds it. Returns a line to
    show when the folder held the text of a run that ended without releasing it, else None."""
    folder = Path(folder).resolve()
    if folder in _held:
        _held[folder].holders += 1
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd) if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
            os.close(fd)
            if holder is None:  # a file system without flock: say so rather than run unguarded
                raise OutputFolderInUseError(
                    f"{key} {folder}: cannot lock {path} ({os.strerror(exc.errno)}); mount the file "
                    "system with flock support, or use a local folder"
                ) from None
            raise OutputFolderInUseError(
                f"{key} {folder} is in use by another training run ({_describe(holder)}); wait for "
                f"it to end, or choose another {key}"
            ) from None
        # The holder before us may have removed the file between our open and our lock: then our
        # lock is on a file nobody else will open. Lock the one at the path instead.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _read_holder(fd)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(me).encode())
    os.fsync(fd)
    _held[folder] = _HeldLock(path, fd)
    if previous:
        return (
            f"{key} {folder}: a run that ended without releasing it left {path} ({_describe(previous)}); "
            "it no longer runs, taking the folder over"
        )
    return None


def release_output_lock(folder: Path) -> None:
    """Drop this process's hold on ``folder``'s lock; the last holder removes the file."""
    folder = Path(folder).resolve()
    held = _held.get(folder)
    if held is None:
        return
    held.holders -= 1
    if held.holders > 0:
        return
    del _held[folder]
    try:
        held.path.unlink(missing_ok=True)  # before unlocking: a waiting run then locks a new file
    finally:
        os.close(held.fd)
