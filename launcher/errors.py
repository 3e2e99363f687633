"""The launcher's user-facing error: one line, exit status 2 (as ``nemo-azr``)."""

from __future__ import annotations

from nemo_azr.errors import NemoAzrError


class LaunchError(NemoAzrError):
    """A bad cluster config or a failed Slurm command, explained in one line."""
