"""Generation backends and rollout workflows (importing registers them)."""

from nemo_azr.rollout import hf_backend, megatron_backend, single_turn, trtllm_backend  # noqa: F401
from nemo_azr.rollout.base import GenerationOutput, GenerationRequest, Sample, SamplingParams, has_capability

__all__ = ["GenerationOutput", "GenerationRequest", "Sample", "SamplingParams", "has_capability"]
