"""SIGTERM / SIGUSR1 -> finish the current step, checkpoint, exit with :data:`EXIT_PREEMPTED`.

SLURM sends SIGUSR1 ahead of the time limit (``--signal=B:USR1@margin``) and SIGTERM on
preemption; the batch script requeues on the distinct exit code.
"""

from __future__ import annotations

import signal
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later"
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionFlag:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, _frame) -> None:
        self.signum = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be handled in the main thread
        for s in _SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)

    def uninstall(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
