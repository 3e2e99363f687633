"""A worker in a spawned process of its own, called over a pipe: one request, one answer.

The generation backend (``rollout.async_generation=process``) and the reward model
(``reward_model.placement=process``) run this way: the child builds its handler once (from a
picklable factory), then answers each ``call(*args)`` with ``handler(*args)``. An exception in the
child comes back as the parent's error type with the child's traceback; a child that dies (the
kernel's out-of-memory killer, a crash in native code) is noticed within a second instead of
leaving the parent waiting on the pipe.

Written by hand: ``multiprocessing.Pool`` and ``concurrent.futures`` restart or hide a dead worker
and cannot keep one long-lived handler (a model) in the child.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

__all__ = ["ServedProcess"]


class ServedProcess:
    """``call(*args)`` runs ``handler(*args)`` in the child, where ``handler = factory()``.

    ``what`` names the process in errors ("the generation process"); ``error`` is the exception
    type raised for its failures; ``passthrough``: exception types the child's start-up may raise
    that come back as they are (a bad setting found in the child: the user's one-line error);
    ``num_threads`` > 0 sets the child's torch threads.
    """

    def __init__(
        self,
        factory: Callable[[], Callable[..., Any]],
        *,
        what: str,
        error: type[Exception] = RuntimeError,
        passthrough: tuple[type[Exception], ...] = (),
        num_threads: int = 0,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.what, self.error = what, error
        self._lock = threading.Lock()  # one call at a time on the pipe
        ctx = mp.get_context("spawn")  # fork would copy a process that has threads and CUDA state
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child_conn, factory, passthrough, num_threads),
            name=f"nemo-azr-{what}",
            daemon=True,
        )
        self._proc.start()
        child_conn.close()
        if not self._conn.poll(start_timeout_s):
            self.shutdown()
            raise error(f"the {what} process did not start within {start_timeout_s:.0f} s")
        try:
            self._receive()  # "ready", or the child's start-up error
        except (error, *passthrough):
            self.shutdown()
            raise

    def call(self, *args: Any) -> Any:
        with self._lock:
            try:
                self._conn.send(args)
            except (OSError, BrokenPipeError) as exc:
                raise self._died() from exc
            return self._receive()

    def is_alive(self) -> bool:
        return self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Ask the child to exit; terminate it if it does not."""
        if self._proc.is_alive():
            try:
                with self._lock:
                    self._conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()

    def _receive(self) -> Any:
        while not self._conn.poll(1.0):  # a child killed mid-call never answers: notice it
            if not self._proc.is_alive():
                raise self._died()
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died() from exc
        if status == "raise":  # a passthrough exception from the child's start-up, as it was
            raise payload
        if status == "error":
            raise self.error(f"{self.what} process failed:\n{payload}")
        return payload

    def _died(self) -> Exception:
        self._proc.join(5)
        return self.error(
            f"the {self.what} process exited (exit code {self._proc.exitcode}; -9 is usually the "
            "kernel's out-of-memory killer)"
        )


def _serve(
    conn,
    factory: Callable[[], Callable[..., Any]],
    passthrough: tuple[type[Exception], ...],
    num_threads: int,
) -> None:
    """The child: build the handler, then answer calls until ``None`` arrives or the parent goes away."""
    # SLURM signals every process of the job step (SIGTERM; SIGUSR1 ahead of the time limit). The
    # trainer stops at a safe point and checkpoints, and it may need one more call to get there:
    # the child leaves the signals to it and exits when the trainer closes it (or its pipe).
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    try:
        if num_threads > 0:
            torch.set_num_threads(num_threads)
        try:
            handler = factory()
        except passthrough as exc:
            conn.send(("raise", exc))
            return
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", traceback.format_exc()))
            return
        conn.send(("ok", "ready"))
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the parent exited
                return
            if message is None:
                return
            try:
                conn.send(("ok", handler(*message)))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", traceback.format_exc()))
    except (BrokenPipeError, EOFError, KeyboardInterrupt):
        return
