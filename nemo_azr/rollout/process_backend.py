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
import signal
import threading
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp

from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, SamplingParams
from nemo_azr.rollout.engine import GenerationEngineBase
from nemo_azr.rollout.hf_backend import HFGenerationBackend


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
        self._lock = threading.Lock()  # one call at a time on the pipe (the trainer may evaluate too)
        ctx = mp.get_context("spawn")  # fork would copy a process that has threads and CUDA state
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child_conn, backend, num_threads), name="nemo-azr-generation", daemon=True
        )
        self._proc.start()
        child_conn.close()
        if not self._conn.poll(start_timeout_s):
            self.shutdown()
            raise GenerationProcessError(
                f"the generation process did not start within {start_timeout_s:.0f} s"
            )
        self._receive()  # "ready", or the child's start-up error

    # --- backend interface ------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        device = self.model_device()
        with self._lock:
            if device.type == "cuda":  # weights written on the parent's streams must land first
                torch.cuda.synchronize(device)
            self._send(("generate", requests, sampling, _rng_state(device)))
            outputs, rng = self._receive()
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
        if self._proc.is_alive():
            try:
                with self._lock:
                    self._conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()

    # --- pipe ---------------------------------------------------------------------------------------
    def _send(self, message: Any) -> None:
        try:
            self._conn.send(message)
        except (OSError, BrokenPipeError) as exc:
            raise self._died() from exc

    def _receive(self) -> Any:
        while not self._conn.poll(1.0):  # a child killed mid-call never answers: notice it
            if not self._proc.is_alive():
                raise self._died()
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died() from exc
        if status == "error":
            raise GenerationProcessError(f"generation process failed:\n{payload}")
        return payload

    def _died(self) -> GenerationProcessError:
        self._proc.join(5)
        return GenerationProcessError(
            f"the generation process exited (exit code {self._proc.exitcode}; -9 is usually the "
            "kernel's out-of-memory killer)"
        )


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


def _serve(conn, backend, num_threads: int) -> None:
    """The child: answer ``generate`` calls until ``None`` arrives or the parent goes away."""
    # SLURM signals every process of the job step (SIGTERM; SIGUSR1 ahead of the time limit). The
    # trainer stops at a safe point and checkpoints, and it may need one more rollout to get there:
    # the child leaves the signals to it and exits when the trainer closes it (or its pipe).
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    try:
        if num_threads > 0:
            torch.set_num_threads(num_threads)
        conn.send(("ok", "ready"))
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the parent exited
                return
            if message is None:
                return
            _, requests, sampling, rng = message
            try:
                device = next(backend.model.parameters()).device
                _set_rng_state(device, rng)
                outputs = backend.generate(requests, sampling)
                conn.send(("ok", (outputs, _rng_state(device))))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", traceback.format_exc()))
    except (BrokenPipeError, EOFError, KeyboardInterrupt):
        return


def _rng_state(device: torch.device) -> tuple[bytes, bytes | None]:
    cuda = torch.cuda.get_rng_state(device).numpy().tobytes() if device.type == "cuda" else None
    return torch.get_rng_state().numpy().tobytes(), cuda


def _set_rng_state(device: torch.device, state: tuple[bytes, bytes | None]) -> None:
    cpu, cuda = state
    torch.set_rng_state(torch.frombuffer(bytearray(cpu), dtype=torch.uint8))
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(cuda), dtype=torch.uint8), device)


__all__ = ["GenerationProcessError", "ProcessGenerationBackend"]
