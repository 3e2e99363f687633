"""Atomic rewrites of the run's small files (metrics.jsonl and samples.jsonl on resume, the W&B run
id): write a temp file in the same folder, fsync it, ``os.replace`` it over the old one, fsync the
folder. A crash at any point leaves either the old file or the new one, never a torn mix; a temp
left by a crash is removed by the next rewrite of the same file."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

TMP_INFIX = ".tmp-"


def _temp_path(path: Path) -> Path:
    return path.parent / f".{path.name}{TMP_INFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove_stale_temps(path: Path) -> None:
    for stale in path.parent.glob(f".{path.name}{TMP_INFIX}*"):
        with contextlib.suppress(OSError):
            stale.unlink()


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp in the same folder, fsync, rename)."""
    path = Path(path)
    _remove_stale_temps(path)
    tmp = _temp_path(path)
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def rewrite_lines(path: Path, keep: Callable[[str], bool]) -> bool:
    """Keep the lines of ``path`` for which ``keep(line)`` is true (empty lines go), atomically.

    Returns whether the file changed; an unchanged file is not rewritten."""
    path = Path(path)
    _remove_stale_temps(path)
    tmp = _temp_path(path)
    changed = False
    try:
        with open(path, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
            for raw in src:
                line = raw.rstrip("\n")
                if line.strip() and keep(line):
                    dst.write(line + "\n")
                    changed |= not raw.endswith("\n")  # a kept last line gets its newline back
                else:
                    changed = True
            if changed:
                dst.flush()
                os.fsync(dst.fileno())
        if changed:
            _replace(tmp, path)
        else:
            tmp.unlink()
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return changed
