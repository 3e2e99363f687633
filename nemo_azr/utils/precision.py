"""Low-precision settings that depend on the machine: ``auto`` and a warning for a slow bf16.

bf16 matmuls are fast only where the hardware does them: CUDA GPUs with bf16 support and CPUs with
AVX512-BF16 or AMX (oneDNN's bf16 kernels). Elsewhere torch falls back to a scalar reference gemm:
on a 2-core AVX2 EPYC a 1024 x 1024 bf16 matmul took 5.7 s against 56 ms in float32. So the
shipped configs ask for ``auto`` (bf16 where it is native, else the model's dtype), and an explicit
bf16 on a machine without it is named once at startup instead of a run that crawls in silence.
"""

from __future__ import annotations

import functools
import sys

import torch

AUTO = "auto"


@functools.cache
def native_bf16(device_type: str) -> bool:
    """Whether bf16 matmuls run on native kernels on this machine's ``device_type`` (cuda / cpu)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        # oneDNN's own test of the CPU's bf16 instructions (AVX512-BF16, AMX); a private op, so a
        # torch without it counts as "not native" (fp32 is never the slow choice)
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def resolve_low_precision(name: str, device: torch.device | str, key: str) -> torch.dtype | None:
    """The dtype a ``model.autocast_dtype`` / ``generation.dtype`` value means on ``device``:
    ``""`` -> None (off / the model's dtype), ``auto`` -> bfloat16 where it is native, else None, a
    dtype name -> that dtype (with a warning when it is bfloat16 and not native)."""
    device_type = torch.device(device).type
    if not name:
        return None
    if name == AUTO:
        return torch.bfloat16 if native_bf16(device_type) else None
    dtype = getattr(torch, name)
    if dtype is torch.bfloat16 and not native_bf16(device_type):
        _warn_once(
            f"{key}=bfloat16: this {device_type.upper()} has no native bf16 matmuls (no AVX512-BF16/AMX), "
            f"where they run many times slower than float32; {key}=auto picks bf16 only where it is native"
        )
    return dtype


@functools.cache
def _warn_once(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)
