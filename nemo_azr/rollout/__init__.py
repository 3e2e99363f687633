"""Generation backends and rollout workflows (importing registers them)."""

from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, Sample, SamplingParams
from nemo_azr.rollout import hf_backend, megatron_backend, single_turn, trtllm_backend  # noqa: F401

__all__ = ["GenerationOutput", "GenerationRequest", "Sample", "SamplingParams"]
