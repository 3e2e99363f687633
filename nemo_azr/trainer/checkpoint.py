"""Atomic ``step_N/`` checkpoints.

A checkpoint is written into a hidden temp folder, every file is fsynced, a ``COMPLETE`` marker is
written last, and only then is the folder renamed to ``step_N`` (rename is atomic on POSIX). A
process killed at any point leaves at most a temp folder, which :meth:`Checkpointer.latest`
never returns and the next save removes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from nemo_azr.errors import CheckpointError

COMPLETE_MARKER = "COMPLETE"
TMP_PREFIX = ".tmp-"
_STEP_RE = re.compile(r"^step_(\d+)$")


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(root))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_complete(folder: Path) -> bool:
    return _STEP_RE.match(folder.name) is not None and (folder / COMPLETE_MARKER).is_file()


def checkpoint_step(folder: Path) -> int:
    m = _STEP_RE.match(folder.name)
    if m is None:
        raise CheckpointError(f"{folder} is not a step_N checkpoint folder")
    return int(m.group(1))


class Checkpointer:
    def __init__(self, root: str | Path, *, keep_last: int = 0) -> None:
        self.root = Path(root)
        self.keep_last = keep_last

    def complete_checkpoints(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and is_complete(p)]
        return sorted(found, key=checkpoint_step)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call ``write(tmp_folder)`` then publish it atomically as ``step_<step>``."""
        tmp = self.begin(step)
        try:
            write(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.publish(tmp, step)

    def begin(self, step: int) -> Path:
        """A fresh temp folder for checkpoint ``step`` (stale temps of killed saves are removed).

        With an asynchronous save, :meth:`publish` is called once the background writes are done;
        no other save may begin in between (the trainer finalizes the previous one first).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        tmp = self.root / f"{TMP_PREFIX}step_{step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def publish(self, tmp: Path, step: int) -> Path:
        """Mark ``tmp`` complete (file list, fsync) and rename it to ``step_<step>``; prune old ones."""
        try:
            files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
            (tmp / COMPLETE_MARKER).write_text(json.dumps({"step": step, "files": files}))
            _fsync_tree(tmp)
            final = self.root / f"step_{step}"
            if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
                old = self.root / f"{TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def _remove_stale_temps(self) -> None:
        for p in self.root.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self) -> None:
        if self.keep_last <= 0:
            return
        for old in self.complete_checkpoints()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def resolve_resume(resume: str, root: Path) -> Path | None:
    """``auto`` -> newest complete checkpoint under ``root`` (or None); ``never`` -> None; else a path."""
    if resume == "never":
        return None
    if resume == "auto":
        return Checkpointer(root).latest()
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"trainer.resume={resume!r}: no such checkpoint folder")
    if not is_complete(path):
        raise CheckpointError(
            f"trainer.resume={resume!r} is not a complete step_N checkpoint (no {COMPLETE_MARKER})"
        )
    return path
