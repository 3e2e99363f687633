"""The hf generation backend in a process of its own (``rollout.async_generation=process``).

With ``rollout.async_rollout`` the producer thread and the trainer share one Python interpreter:
the token-by-token decode loop and the training step's autograd bookkeeping take turns holding the
GIL, so overlapping them gains little (docs/throughput.md). Here the decode loop runs in a spawned
child process with its own interpreter; the producer thread only waits on a pipe.

The child's model and the parent's view of it share their storage (``Module.share_memory()``:
shared memory on the CPU, CUDA IPC on a GPU), so a weight push is a ``load_state_dict`` in the
parent with nothing sent. The torch RNG state travels with every call and comes back, so a call
draws exactly the random numbers an in-process backend would: with ``max_policy_lag = 0`` a run
equals the synchronous one sample for sample.

Written by hand because no library runs a transformers decode loop in a worker process with
shared, refittable weights; TensorRT-LLM's and vLLM's engines do the same for their own kernels.
"""

from __future__ import annotations

import shutil
from functools import partial

import torch

from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from nemo_azr.rollout.engine import GenerationEngineBase
from nemo_azr.rollout.hf_backend import HFGenerationBackend
from nemo_azr.utils.served_process import ServedProcess


class GenerationProcessError(RuntimeError):
    """The generation process failed or exited; the message carries its traceback or exit code."""


class ProcessGenerationBackend(GenerationEngineBase):
    """Proxy with the backend interface (``generate``, ``sync_weights``, ``model``, ``version``); the
    wrapped backend's ``generate`` runs in a child process. ``shutdown()`` stops the child."""

    def __init__(self, backend, *, num_threads: int = 0, start_timeout_s: float = 300.0) -> None:
        super().__init__()
        self.model = backend.model
        _check_shared_memory(self.model)
        self.model.share_memory()  # before the child starts: it receives handles to this storage
        self.tokenizer = backend.tokenizer
        self.version = backend.version
        self._child = ServedProcess(
            partial(_Generate, backend),
            what="generation",
            error=GenerationProcessError,
            num_threads=num_threads,
            start_timeout_s=start_timeout_s,
        )

    # --- backend interface ------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        device = self.model_device()
        if device.type == "cuda":  # weights written on the parent's streams must land first
            torch.cuda.synchronize(device)
        outputs, rng = self._child.call(requests, sampling, _rng_state(device))
        _set_rng_state(device, rng)
        for out in outputs:  # the parent sets the version on a push; the child's copy never moves
            out.policy_version = self.version
        return outputs

    # The hf backend's own: they only touch ``model`` and ``version``, which the proxy holds.
    sync_weights = HFGenerationBackend.sync_weights
    flush_cache = HFGenerationBackend.flush_cache

    def release(self) -> None:
        """The child keeps its decode caches and captured graphs between calls (they live in its memory)."""

    def model_device(self) -> torch.device:
        param = next(self.model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Ask the child to exit; terminate it if it does not."""
        self._child.shutdown(timeout_s)


SHM_DIR = "/dev/shm"


def _check_shared_memory(model: torch.nn.Module, shm_dir: str = SHM_DIR) -> None:
    """CPU weights are shared through ``/dev/shm``; a container's default (64 MB) is too small for a
    real model, and torch would fail with a bus error deep inside: say so first."""
    needed = sum(t.numel() * t.element_size() for t in model.state_dict().values() if not t.is_cuda)
    try:
        free = shutil.disk_usage(shm_dir).free
    except OSError:  # no /dev/shm (not Linux): torch picks its own mechanism
        return
    if needed > free:
        raise GenerationProcessError(
            f"rollout.async_generation=process shares the generation model's {needed / 2**30:.2f} GiB "
            f"through {shm_dir}, which has {free / 2**30:.2f} GiB free: enlarge it (docker run "
            "--shm-size, a larger tmpfs) or use rollout.async_generation=thread"
        )


class _Generate:
    """The child's handler: the torch RNG state travels in and out with every call."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def __call__(self, requests, sampling, rng):
        device = next(self.backend.model.parameters()).device
        _set_rng_state(device, rng)
        outputs = self.backend.generate(requests, sampling)
        return outputs, _rng_state(device)


def _rng_state(device: torch.device) -> tuple[bytes, bytes | None]:
    cuda = torch.cuda.get_rng_state(device).numpy().tobytes() if device.type == "cuda" else None
    return torch.get_rng_state().numpy().tobytes(), cuda


def _set_rng_state(device: torch.device, state: tuple[bytes, bytes | None]) -> None:
    cpu, cuda = state
    torch.set_rng_state(torch.frombuffer(bytearray(cpu), dtype=torch.uint8))
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(cuda), dtype=torch.uint8), device)


__all__ = ["GenerationProcessError", "ProcessGenerationBackend"]
