"""The model cache shared by the tiny model and imported models: where it is, and one build at a time."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV_VAR = "NEMO_AZR_CACHE"
DEFAULT_CACHE_ROOT = Path("~/.cache/nemo_azr")


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Exclusive lock on ``lock_path`` (created if missing), so concurrent processes build a cache entry once."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed, even on a crash
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
