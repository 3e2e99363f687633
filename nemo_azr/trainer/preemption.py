"""SIGTERM / SIGUSR1 -> stop at a safe point, checkpoint what is worth keeping, exit with :data:`EXIT_PREEMPTED`.

SLURM sends SIGUSR1 ahead of the time limit (``--signal=B:USR1@margin``) and SIGTERM on
preemption; the batch script requeues on the distinct exit code.

The handler is installed first thing in ``nemo-azr train`` (before the heavy imports, the config
and the model build), so a signal at any moment of a run ends it with 75, never with the signal's
default action (death without a checkpoint or requeue). What a signal does depends on the phase
the run is in (:meth:`PreemptionFlag.phase`):

- *interruptible* phases hold nothing that a checkpoint does not already have (imports, config,
  model build, loading the resume checkpoint): the handler raises :class:`Preempted` at once, and
  the run exits 75 within moments;
- every other phase (supervised warm-up, W&B init, the training steps) only records the signal;
  the code checks :attr:`PreemptionFlag.requested` at its next safe point and saves first.

This module imports nothing heavy: ``nemo_azr_launch.torchrun_node`` and the CLI import it before torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later"
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Set by the SLURM batch script: a folder where every rank reports that its handler is installed.
#: Until all have, the script holds a signal instead of forwarding it (a Python process has no
#: handler in its first ~0.1 s, and the signal's default action would end the job FAILED).
READY_DIR_ENV = "NEMO_AZR_READY_DIR"


def report_ready() -> None:
    """Tell the batch script this rank acts on SIGTERM / SIGUSR1 from now on (``rank-<RANK>``)."""
    folder = os.environ.get(READY_DIR_ENV)
    if not folder:
        return
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    with contextlib.suppress(OSError):  # no marker: the script keeps holding, never worse than before
        open(os.path.join(folder, f"rank-{rank}"), "w").close()


PEER_LOST_MARKER = "peer-lost"


def note_peer_lost(message: str) -> None:
    """Tell the batch script that this job stopped because ranks were lost (``peer-lost`` in the
    ready folder holds the line): it then stops what is left of the job step and requeues."""
    folder = os.environ.get(READY_DIR_ENV)
    if not folder:
        return
    with contextlib.suppress(OSError), open(os.path.join(folder, PEER_LOST_MARKER), "w") as fh:
        fh.write(message + "\n")


def signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name
    except (TypeError, ValueError):
        return f"signal {signum}"


class Preempted(BaseException):
    """A preemption signal arrived during an interruptible phase (nothing unsaved to keep).

    A ``BaseException``, like ``KeyboardInterrupt``: library code's ``except Exception`` must not
    swallow it."""

    def __init__(self, signum: int | None, phase: str) -> None:
        super().__init__(f"{signal_name(signum)} during {phase}")
        self.signum = signum
        self.phase = phase


class PreemptionFlag:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._phase = "start-up"
        self._interruptible = False
        self._raised = False  # raise Preempted at most once: the clean-up after it must run undisturbed
        self.signal_phase: str | None = None  # the phase the first signal arrived in

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    @property
    def current_phase(self) -> str:
        return self._phase

    def _handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signal_phase = self._phase
        self.signum = signum
        if self._interruptible and not self._raised:
            self._raised = True
            raise Preempted(signum, self._phase)

    def install(self) -> bool:
        """Handle SIGTERM and SIGUSR1 from now on. Returns False (and does nothing) when already
        installed or off the main thread (signals can only be handled there)."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return False
        for s in _SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return True

    def uninstall(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def enter(self, name: str, *, interruptible: bool) -> None:
        """From now on the run is in phase ``name``. Entering an interruptible phase after a
        signal (recorded during an earlier phase) raises :class:`Preempted` at once."""
        self._phase, self._interruptible = name, interruptible
        if interruptible and self.requested:
            self._raised = True
            raise Preempted(self.signum, name)

    @contextlib.contextmanager
    def phase(self, name: str, *, interruptible: bool) -> Iterator[None]:
        """:meth:`enter` phase ``name`` for the block, then return to the phase around it."""
        previous = (self._phase, self._interruptible)
        try:
            self.enter(name, interruptible=interruptible)
            yield
        finally:
            self._phase, self._interruptible = previous

    def describe(self) -> str:
        """``SIGTERM during supervised warm-up``: the first signal and the phase it arrived in."""
        return f"{signal_name(self.signum)} during {self.signal_phase or self._phase}"


def agree_on_signal(flag: PreemptionFlag, all_reduce_max: Callable[[int], int]) -> bool:
    """Whether the ranks stop now: every rank contributes the signal it has recorded (0: none) and
    all act on the reduced value, never on their own flag. A signal whose handler runs while the
    collective is in flight was not contributed; acting on it here would stop this rank alone and
    leave its peers waiting in the next step's collectives. It is contributed at the next check."""
    agreed = all_reduce_max(int(flag.signum or 0))
    if agreed and not flag.requested:  # another rank got it
        flag.signal_phase = flag.current_phase
        flag.signum = signal.Signals(agreed)
    return bool(agreed)
