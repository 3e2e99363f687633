"""One exception family for problems a user can fix (bad config, bad data, bad checkpoint).

The CLI catches :class:`NemoAzrError` and prints its message on one line; anything else is a bug
and keeps its traceback.
"""


class NemoAzrError(Exception):
    """A user-facing problem; the message says what is wrong and what to do."""


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


EXIT_USAGE = 2  # a user-facing problem (bad config, bad data, damaged checkpoint): fix and rerun
EXIT_INTERRUPTED = 130  # Ctrl-C, as the shell reports it


def run_reporting_errors(prog: str, fn, *args) -> int:
    """``fn(*args)``; a :class:`NemoAzrError` becomes one ``<prog>: error: ...`` line and exit 2, Ctrl-C
    one line and 130 (every command line of the project ends this way; a bug keeps its traceback)."""
    import sys

    try:
        return fn(*args)
    except NemoAzrError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
