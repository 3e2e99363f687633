"""Worker extension loaded inside TensorRT-LLM's GPU workers (``ray_worker_extension_cls``).

TensorRT-LLM's RLHF extension brings ``update_weights`` (CUDA IPC handles, then ``None`` to
finalise); this subclass adds per-parameter checksums, which the refit guard asks for through the
LLM's collective RPC when the probe log-probs disagree with the trainer's, and the version of the
weights each rank holds, which every rollout row is stamped with. Imported only by the
engine's workers (by its dotted path), never by ``import nemo_azr``: it needs ``tensorrt_llm``.
"""

from __future__ import annotations

import torch
from tensorrt_llm.llmapi.rlhf_utils import WorkerExtension


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
    def weight_checksums(self) -> dict[str, tuple[float, float, int]]:
        """{engine parameter name: (float64 sum, sum of squares, numel)} of this rank's parameters."""
        out = {}
        for name, p in self.engine.model_engine.model.named_parameters():
            t = p.detach().double()
            out[name] = (float(t.sum()), float((t * t).sum()), t.numel())
        return out
