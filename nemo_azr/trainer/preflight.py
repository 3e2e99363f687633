"""Checks a run makes before any work: the device exists, the output folders can be written.

They run where the job runs (a compute node), not in config validation: a login node without a GPU
may compose and submit a ``trainer.device=cuda`` config.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import torch

from nemo_azr.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a usable GPU is one clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        build = f"a CPU-only torch {torch.__version__}" if torch.version.cuda is None else "no visible GPU"
        raise ConfigError(
            f"trainer.device={name} but this machine has no usable CUDA device ({build}; "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
            "use trainer.device=cpu or auto"
        )
    return device


def check_writable(folder: Path, key: str) -> None:
    """Create ``folder`` and write+remove a probe file in it, so a read-only or full file system
    fails at start instead of at the first checkpoint, after hours of training."""
    probe = folder / f".write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    blocker = next((p for p in (folder, *folder.parents) if p.is_file()), None)
    if blocker is not None:
        what = "is a file" if blocker == folder else f"is under {str(blocker)!r}, which is a file"
        raise ConfigError(f"{key}={str(folder)!r} {what}, not a folder; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        raise ConfigError(f"{key}={str(folder)!r} is not writable: {exc.strerror or exc}") from None
    probe.unlink()
