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
