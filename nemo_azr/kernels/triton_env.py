"""What the environment says about Triton, without importing it: installed, and whether its CPU
interpreter is asked for. Both the backend choice and the Triton kernels read it (one module below
both, so neither imports the other)."""

from __future__ import annotations

import importlib.util
import os

_TRUE = ("1", "true", "yes", "on", "y")


def interpret_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter (read at every call)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None
