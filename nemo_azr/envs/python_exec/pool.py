"""Concurrent sandbox runs: a process-wide bound on running sandboxes, an ordered fan-out, a clock.

A self-play step runs many small programs: every proposed question twice (gold outputs), then
the solvers' answers. Each is a child process that mostly waits (interpreter start-up, a program
that loops until its CPU limit), so running them one after another leaves the cores idle. The
call sites fan out over threads (:func:`map_ordered`: results in the input order) and every
:func:`~.sandbox.run_python` holds one slot of :data:`LIMITER` while its child runs, which bounds
the number of sandboxes alive at once (``python_exec.max_concurrent_runs``; 0 = one per core).
Each run keeps its own limits; only the waiting overlaps.

:data:`LIMITER` also measures the wall-clock time during which at least one sandbox was running
(``seconds``), the sandbox's share of a step (``timing/sandbox_s``).

Threads, not a process pool: the work happens in the sandbox's own child processes; a thread
only starts one and reads its pipes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


class SandboxLimiter:
    """At most ``limit`` sandboxes at once, and the wall time with at least one running."""

    def __init__(self, limit: int = 0) -> None:
        self._cond = threading.Condition()
        self._limit = limit or default_workers()
        self._active = 0
        self._busy_since = 0.0
        self._seconds = 0.0

    @property
    def limit(self) -> int:
        return self._limit

    def configure(self, limit: int) -> None:
        """Set the bound (0: one per core); runs already going are not interrupted."""
        if limit < 0:
            raise ValueError(f"max_concurrent_runs must be >= 0, got {limit}")
        with self._cond:
            self._limit = limit or default_workers()
            self._cond.notify_all()

    @contextmanager
    def slot(self):
        """Hold one of the ``limit`` slots while the body (one sandbox run) executes."""
        with self._cond:
            while self._active >= self._limit:
                self._cond.wait()
            if self._active == 0:
                self._busy_since = time.monotonic()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._seconds += time.monotonic() - self._busy_since
                self._cond.notify()

    def seconds(self) -> float:
        """Wall time so far during which at least one sandbox was running."""
        with self._cond:
            running = time.monotonic() - self._busy_since if self._active else 0.0
            return self._seconds + running


#: The process's limiter (sandboxes are a machine resource, shared by every caller).
LIMITER = SandboxLimiter()


def map_ordered(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]`` with the calls running concurrently (one thread each; the sandbox
    runs inside are bounded by :data:`LIMITER`). An exception is raised as the sequential loop
    would raise it: the first one in input order."""
    items = list(items)
    if len(items) <= 1 or LIMITER.limit == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = [pool.submit(fn, x) for x in items]
        return [f.result() for f in futures]
