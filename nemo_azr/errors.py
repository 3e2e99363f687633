"""One exception family for problems a user can fix (bad config, bad data, bad checkpoint).

The CLI catches :class:`NemoAzrError` and prints its message on one line; anything else is a bug
and keeps its traceback.
"""


class NemoAzrError(Exception):
    """A user-facing problem; the message says what is wrong and what to do."""

    exit_code = 2  # EXIT_USAGE: fix and rerun
    report = True  # this process prints the line (a job's ranks may leave it to one of them)


class ConfigError(NemoAzrError):
    """A configuration value is missing, misspelt, of the wrong type or inconsistent."""


class BatchContractError(NemoAzrError):
    """A batch entering a stage lacks a key or has a key of the wrong shape/dtype."""


class DataError(NemoAzrError):
    """A dataset is empty, unreadable or has rows without the required fields."""


class CheckpointError(NemoAzrError):
    """A checkpoint is missing, incomplete or was written for another model shape."""


class CheckpointDamagedError(CheckpointError):
    """A published checkpoint whose files do not match its manifest, or cannot be read."""


class RewardError(NemoAzrError):
    """A reward function returned something unusable (NaN/inf, wrong length)."""


class StorageFullError(NemoAzrError):
    """A write failed because its file system is full or over quota. Exit 74 (sysexits' EX_IOERR):
    not 75, so a SLURM job is not requeued into the same full disk, and not 2, so a script can tell
    "free space and rerun" from "fix the config"."""

    exit_code = 74


class PeerLostError(NemoAzrError):
    """A collective failed because other ranks stopped (a node lost, a process killed or hung).
    Exit 76: the batch script requeues the job (a restart resumes from the newest checkpoint) where
    requeueing is allowed. ``report`` is False on all survivors but one, so a job says it once."""

    exit_code = 76

    def __init__(self, message: str, *, report: bool = True) -> None:
        super().__init__(message)
        self.report = report


def storage_full_reason(exc: BaseException) -> str | None:
    """``"No space left on device"`` / ``"Disk quota exceeded"`` when ``exc`` or an exception it was
    raised from is that OSError, else None."""
    import errno
    import os

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return os.strerror(exc.errno)
        exc = exc.__cause__ or exc.__context__
    return None


EXIT_USAGE = 2  # a user-facing problem (bad config, bad data, damaged checkpoint): fix and rerun
EXIT_STORAGE_FULL = StorageFullError.exit_code  # a full or over-quota file system: free space, rerun
EXIT_PEER_LOST = PeerLostError.exit_code  # other ranks stopped: requeue and resume where allowed
EXIT_INTERRUPTED = 130  # Ctrl-C, as the shell reports it


def run_reporting_errors(prog: str, fn, *args) -> int:
    """``fn(*args)``; a :class:`NemoAzrError` becomes one ``<prog>: error: ...`` line and its exit code
    (2; 74 for a full disk, as is an OSError "no space left" / "quota exceeded"), Ctrl-C one line and 130 (every command line of the project ends this way; a bug keeps its traceback)."""
    import sys

    try:
        return fn(*args)
    except NemoAzrError as exc:
        if exc.report:
            print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        reason = storage_full_reason(exc)
        if reason is None:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"{prog}: error: {reason}{where}; free space on that file system and rerun", file=sys.stderr)
        return EXIT_STORAGE_FULL
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
