"""Reading and writing the hf backends' checkpoint files with one-line errors (policy and critic).

A file that cannot be read is a :class:`CheckpointDamagedError` naming it; weights of another shape
are a :class:`CheckpointError` saying so; never torch's or safetensors' traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model

from nemo_azr.errors import CheckpointDamagedError, CheckpointError


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def load_weights(
    module: torch.nn.Module, path: Path, *, device: torch.device, where: str, misfit: str
) -> None:
    """``path`` (safetensors) into ``module``, strictly. ``where``: the file as the user should read it
    (``checkpoint X: model/model.safetensors``); ``misfit``: what a shape mismatch means."""
    try:
        load_model(module, str(path), strict=True, device=str(device))
    except SafetensorError as exc:
        raise CheckpointDamagedError(f"{where} is unreadable ({_first_line(exc)})") from None
    except RuntimeError as exc:
        raise CheckpointError(f"{where}: {misfit}: {_first_line(exc)}") from None


def save_training_state(optimizer: torch.optim.Optimizer, scheduler, path: Path) -> None:
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, path)


def load_training_state(optimizer: torch.optim.Optimizer, scheduler, path: Path, *, where: str) -> None:
    """The optimizer and LR-scheduler state of :func:`save_training_state`."""
    try:
        state = torch.load(path, weights_only=False)
        optimizer_state, scheduler_state = state["optimizer"], state["scheduler"]
    except Exception as exc:  # noqa: BLE001 - torch.load raises many types for a damaged file
        raise CheckpointDamagedError(
            f"{where} is unreadable ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
