"""Backend selection for the log-prob kernels: ``auto | triton | torch`` (no triton import here)."""

from __future__ import annotations

import torch

from nemo_azr.errors import ConfigError
from nemo_azr.kernels.triton_env import interpret_enabled, triton_available

__all__ = ["BACKENDS", "interpret_enabled", "get_row_ops", "resolve_backend", "triton_available"]

BACKENDS = ("auto", "triton", "torch")


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"`` for these tensors.

    ``auto``: triton when it is importable and the tensors are on CUDA or ``TRITON_INTERPRET`` is set
    (CPU interpreter, slow: meant for tests), else torch. ``triton`` raises :class:`ConfigError`
    when those conditions do not hold, instead of silently falling back.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown kernels backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return "torch"
    on_cuda = any(t.is_cuda for t in tensors)
    usable = triton_available() and (on_cuda or interpret_enabled())
    if backend == "auto":
        return "triton" if usable else "torch"
    if not triton_available():
        raise ConfigError("kernels backend 'triton' needs the triton package (pip install triton)")
    if not usable:
        raise ConfigError(
            "kernels backend 'triton' needs CUDA tensors, or TRITON_INTERPRET=1 to run the kernels "
            "in Triton's CPU interpreter (slow; for tests); use backend='torch' or 'auto' on CPU"
        )
    return "triton"


def get_row_ops(backend: str):
    """The row-ops class of a resolved backend name."""
    if backend == "triton":
        from nemo_azr.kernels.triton_logprobs import TritonRowOps

        return TritonRowOps
    from nemo_azr.kernels.row_ops import TorchRowOps

    return TorchRowOps
