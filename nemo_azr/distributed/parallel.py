"""Process-group set-up for the Megatron-core backend: torch.distributed, megatron's groups, seeding.

:func:`initialize_parallel` works under ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` in the
environment) and in a plain single process (world size 1 over a private FileStore). It picks gloo on
CPU and nccl on GPU, applies :mod:`nemo_azr.distributed.cpu_shims` on CPU, creates megatron-core's
tensor/pipeline/data-parallel groups and seeds megatron's RNG tracker. Every group's collectives time
out after ``parallel.timeout_s``; with several processes each rank also starts its heartbeat
(:mod:`nemo_azr.distributed.peer_loss`), so a failed collective names the ranks that were lost.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nemo_azr.config.schema import ParallelConfig
from nemo_azr.distributed.peer_loss import start_heartbeat, stop_heartbeat
from nemo_azr.errors import ConfigError

__all__ = [
    "ParallelLayout",
    "destroy_parallel",
    "global_rank",
    "initialize_parallel",
    "resolve_dist_backend",
    "world_size",
]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_OWNED_STORE: str | None = None  # FileStore file of a single-process group we created (removed on destroy)


@dataclass(frozen=True)
class ParallelLayout:
    """How the model is split: ``tp * pp * dp`` processes (``dp=0``: derived from the world size)."""

    tp: int = 1
    pp: int = 1
    dp: int = 0
    sequence_parallel: bool = False
    vpp: int = 0  # virtual pipeline stages per rank (interleaved schedule); 0: off
    make_vocab_size_divisible_by: int = 128  # vocabulary padded to a multiple of this x tp

    def __post_init__(self) -> None:
        for name in ("tp", "pp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel layout {name}={getattr(self, name)} must be >= 1")
        if self.dp < 0 or self.vpp < 0:
            raise ConfigError(
                f"parallel layout dp={self.dp} and vpp={self.vpp} must be >= 0 (0: off/derived)"
            )
        if self.vpp and self.pp == 1:
            raise ConfigError(f"virtual pipeline size {self.vpp} needs pipeline parallel size > 1")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("sequence_parallel needs tensor parallel size > 1")
        if self.make_vocab_size_divisible_by < 1:
            raise ConfigError(
                f"make_vocab_size_divisible_by={self.make_vocab_size_divisible_by} must be >= 1"
            )

    @classmethod
    def from_config(cls, cfg: ParallelConfig) -> ParallelLayout:
        """The layout of the ``parallel`` config group."""
        return cls(
            tp=cfg.tensor_model_parallel_size,
            pp=cfg.pipeline_model_parallel_size,
            dp=cfg.data_parallel_size,
            sequence_parallel=cfg.sequence_parallel,
            vpp=cfg.virtual_pipeline_model_parallel_size,
            make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by,
        )

    def data_parallel_size(self, world_size: int) -> int:
        """``dp`` for ``world_size`` processes; ConfigError when the layout does not tile the world."""
        model = self.tp * self.pp
        if world_size % model:
            raise ConfigError(
                f"world size {world_size} is not divisible by tp*pp = {self.tp}*{self.pp} = {model}"
            )
        dp = world_size // model
        if self.dp and self.dp != dp:
            raise ConfigError(
                f"world size {world_size} != tp*pp*dp = {self.tp}*{self.pp}*{self.dp} = {model * self.dp}"
            )
        return dp


def global_rank() -> int:
    """This process's rank (0 without torch.distributed)."""
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """The number of processes (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def resolve_dist_backend(backend: str = "auto") -> str:
    """``auto`` -> nccl with CUDA, else gloo; nccl without CUDA is a ConfigError."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"distributed backend {backend!r} is unknown; use auto, gloo or nccl")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError("distributed backend nccl needs CUDA; use gloo (or auto) on CPU")
    return backend


def _init_process_group(backend: str, timeout_s: float) -> None:
    global _OWNED_STORE
    if dist.is_initialized():
        return
    if all(v in os.environ for v in _TORCHRUN_VARS):
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return
    # A lone process: a private FileStore needs no free port and cannot collide with other runs.
    fd, path = tempfile.mkstemp(prefix="nemo_azr_store_")
    os.close(fd)
    os.unlink(path)  # FileStore wants to create the file itself
    _OWNED_STORE = path
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.FileStore(path, 1), rank=0, world_size=1)


def _seed(seed: int) -> None:
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        torch.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)
    else:
        from nemo_azr.distributed.cpu_shims import cpu_model_parallel_manual_seed

        cpu_model_parallel_manual_seed(seed)


def initialize_parallel(
    layout: ParallelLayout, *, seed: int = 0, backend: str = "auto", timeout_s: float = 600.0
) -> int:
    """Set up torch.distributed and megatron-core's groups for ``layout``; returns the data-parallel size.

    Safe to call when torch.distributed is already initialised (e.g. by the launcher). Raises
    ConfigError when the world size does not equal ``tp * pp * dp``. ``timeout_s`` bounds every
    collective of the default group and of megatron's groups.
    """
    from megatron.core import parallel_state

    backend = resolve_dist_backend(backend)
    if backend == "gloo" and not torch.cuda.is_available():
        from nemo_azr.distributed.cpu_shims import apply_cpu_shims

        apply_cpu_shims()
    if dist.is_initialized():
        world = dist.get_world_size()
    else:
        world = int(os.environ.get("WORLD_SIZE", "1")) if all(v in os.environ for v in _TORCHRUN_VARS) else 1
    dp = layout.data_parallel_size(world)  # checked before any group exists: no hang on a bad layout
    _init_process_group(backend, timeout_s)
    start_heartbeat(timeout_s)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp or None,
        distributed_timeout_minutes=timeout_s / 60,  # timedelta(minutes=...) takes a fraction
        # gloo twins of the data-parallel groups are only needed for CPU-side optimizer state I/O
        create_gloo_process_groups=False,
    )
    _seed(seed)
    return dp


def destroy_parallel() -> None:
    """Tear down megatron-core's groups and the default process group (both if they exist)."""
    global _OWNED_STORE
    from megatron.core import parallel_state

    stop_heartbeat()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    if _OWNED_STORE is not None:
        if os.path.exists(_OWNED_STORE):
            os.unlink(_OWNED_STORE)
        _OWNED_STORE = None
