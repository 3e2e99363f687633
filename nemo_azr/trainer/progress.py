"""Progress lines for work that runs before the metrics logger exists (the supervised warm-up).

A real model's warm-up takes minutes to over an hour on a CPU (133 s a step for SmolLM2-135M in fp32
on two AVX2 cores), so a line every few steps alone can leave a user without news for half an hour.
The first line comes after the first step (its time and an estimate of the rest); later ones every
``every`` steps or ``seconds`` of wall time, whichever comes first, and one at the end. The rate is
that of the last ``every`` steps, not the mean since the start: after a slow stretch (another job
on the machine, a paused process) the estimate recovers within ``every`` steps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WARMUP_PROGRESS_EVERY = 10  # warm-up steps between two progress lines ...
WARMUP_PROGRESS_SECONDS = 120.0  # ... or this much wall time, whichever comes first


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class StepProgress:
    """``on_step(step, loss)`` after each step (``step`` counted from 0 over the whole job); emits
    ``"<label>: step k/N, loss x, t s/step, elapsed, about T left"`` lines through ``emit``.

    ``first_step`` is the step this process starts at (a resumed warm-up): the rate and the
    estimate use only the steps this process timed, at most the last ``every`` of them.
    """

    def __init__(
        self,
        label: str,
        total: int,
        emit: Callable[[str], None],
        *,
        first_step: int = 0,
        every: int = WARMUP_PROGRESS_EVERY,
        seconds: float = WARMUP_PROGRESS_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if every < 1 or seconds <= 0:
            raise ValueError(f"progress every {every} steps / {seconds} s: both must be positive")
        self.label, self.total, self.emit = label, total, emit
        self.first_step, self.every, self.seconds, self.clock = first_step, every, seconds, clock
        self.start = clock()
        self.last_line = self.start
        # (steps timed, clock) at the last every + 1 step ends: the window the rate is read over
        self.recent: deque[tuple[int, float]] = deque([(0, self.start)], maxlen=every + 1)

    def __call__(self, step: int, loss: float) -> None:
        done, now = step + 1, self.clock()
        timed = done - self.first_step
        if timed >= 1:
            self.recent.append((timed, now))
        due = (
            timed == 1 or done == self.total or done % self.every == 0 or now - self.last_line >= self.seconds
        )
        if not due or timed < 1:
            return
        self.last_line = now
        elapsed = now - self.start
        oldest_timed, oldest_at = self.recent[0]
        per_step = (now - oldest_at) / max(1, timed - oldest_timed)
        left = "" if done >= self.total else f", about {_duration(per_step * (self.total - done))} left"
        self.emit(
            f"{self.label}: step {done}/{self.total}, loss {loss:.3f}, {per_step:.1f} s/step, "
            f"{_duration(elapsed)} elapsed{left}"
        )
