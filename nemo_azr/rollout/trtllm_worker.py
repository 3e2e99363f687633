"""Worker extension loaded inside TensorRT-LLM's GPU workers (``ray_worker_extension_cls``).

TensorRT-LLM's RLHF extension brings ``update_weights`` (CUDA IPC handles, then ``None`` to
finalise); this subclass adds:

* ``update_weights_checked``: the same load, after checking every tensor of the bucket against the
  checksum the trainer computed of what it sent, so a handle that resolves to the wrong or stale
  memory stops the refit at that bucket, naming the tensor, before anything of it is loaded;
* per-parameter checksums, which the refit guard asks for when the probe log-probs disagree;
* the version of the weights each rank holds, which every rollout row is stamped with.

Imported only by the engine's workers (by its dotted path), never by ``import nemo_azr``: it needs
``tensorrt_llm``.
"""

from __future__ import annotations

import base64
import io
import pickle
from typing import Any

import torch
from tensorrt_llm.llmapi.rlhf_utils import WorkerExtension

#: relative tolerance of a received tensor's float64 sum / sum of squares against the trainer's: the
#: same values summed in another order (GPU reduction vs the trainer's) differ in the last bits only
BUCKET_CHECKSUM_RTOL = 1e-6


class _TorchOnlyUnpickler(pickle.Unpickler):
    """The payload names only builtins and torch (as TensorRT-LLM's own restricted unpickler)."""

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] not in ("builtins", "torch"):
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a weight payload")
        return super().find_class(module, name)


def _received(handles: str | list, device_id: int) -> list[tuple[str, torch.Tensor]]:
    """The tensors one rank's entry of an update_weights payload points to (rebuilt as the library's
    update_weights rebuilds them: a CUDA handle's device index, args[6], set to this rank's GPU)."""
    if isinstance(handles, str):
        handles = _TorchOnlyUnpickler(io.BytesIO(base64.b64decode(handles))).load()
    out = []
    for name, (rebuild, args) in handles:
        args = list(args)
        if len(args) > 6:
            args[6] = device_id
        out.append((name, rebuild(*args)))
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= BUCKET_CHECKSUM_RTOL * max(abs(a), abs(b), 1e-6)


class RefitWorkerExtension(WorkerExtension):
    #: the policy version of the weights this rank holds: -1 from the first bucket of a refit until
    #: the refit is checked, so a rank that is part-way through (or never got the refit) says so
    weight_version: int = -1

    def device_uuid(self) -> str:
        """The UUID of the GPU this rank runs on: the key of its IPC handles in ``update_weights``."""
        from tensorrt_llm._torch.utils import get_device_uuid

        return get_device_uuid(self.device_id)

    def set_weight_version(self, version: int) -> None:
        self.weight_version = int(version)

    def get_weight_version(self) -> int:
        return self.weight_version

    @torch.no_grad()
    def update_weights_checked(
        self, ipc_handles: dict[str, Any], expected: dict[str, tuple[float, float]]
    ) -> None:
        """``update_weights(ipc_handles)`` once every tensor of this rank's entry has the float64
        (sum, sum of squares) the trainer computed of what it sent; a mismatch raises naming the
        tensor, before any of the bucket is loaded."""
        uuid = self.device_uuid()
        try:
            self._check_and_load(uuid, ipc_handles, expected)
        except Exception as exc:  # named by rank: the collective RPC does not say which rank raised
            raise RuntimeError(f"rank on GPU {uuid}: {type(exc).__name__}: {exc}") from exc

    def _check_and_load(
        self, uuid: str, ipc_handles: dict[str, Any], expected: dict[str, tuple[float, float]]
    ) -> None:
        handles = ipc_handles.get(uuid)
        if handles is None:
            raise ValueError("no weights for its GPU in the payload")
        received = _received(handles, self.device_id)
        missing = sorted(set(expected) - {name for name, _ in received})
        if missing:
            raise ValueError(f"the bucket lacks {len(missing)} tensor(s) the trainer sent: {missing[:3]}")
        for name, tensor in received:
            t = tensor.double()
            got = (float(t.sum()), float((t * t).sum()))
            want = expected[name]
            if not (_close(got[0], want[0]) and _close(got[1], want[1])):
                raise ValueError(
                    f"tensor {name} arrived with checksum (sum {got[0]:.6g}, sum of squares {got[1]:.6g}), "
                    f"the trainer sent (sum {want[0]:.6g}, sum of squares {want[1]:.6g})"
                )
        self.update_weights(ipc_handles)

    @torch.no_grad()
    def weight_checksums(self) -> dict[str, tuple[float, float, int]]:
        """{engine parameter name: (float64 sum, sum of squares, numel)} of this rank's parameters."""
        out = {}
        for name, p in self.engine.model_engine.model.named_parameters():
            t = p.detach().double()
            out[name] = (float(t.sum()), float((t * t).sum()), t.numel())
        return out
