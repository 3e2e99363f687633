"""Megatron-core policy model: a ``GPTModel`` equivalent to a HF Llama / Qwen2, its HF weight adapter,
vocab-parallel token log-probs, the TP/PP/DP policy (optionally with megatron's distributed
optimizer) and resharding checkpoints. Needs megatron-core (``pip install -e '.[megatron]'``)."""

# first, before megatron-core's first import: it filters megatron-core's fallback warnings
from nemo_azr.models.megatron import fallback_notice  # noqa: F401, I001
from nemo_azr.models.megatron.builder import (
    build_gpt_model,
    check_layout_fits,
    padded_vocab_size,
    transformer_config_from_hf,
)
from nemo_azr.models.megatron.hf_adapter import (
    gather_hf_state_dict,
    hf_to_megatron,
    load_hf_into_megatron,
    megatron_to_hf,
)
from nemo_azr.models.megatron.logprobs import megatron_token_logprobs
from nemo_azr.models.megatron.policy import MegatronPolicy

__all__ = [
    "MegatronPolicy",
    "build_gpt_model",
    "check_layout_fits",
    "gather_hf_state_dict",
    "hf_to_megatron",
    "load_hf_into_megatron",
    "megatron_to_hf",
    "megatron_token_logprobs",
    "padded_vocab_size",
    "transformer_config_from_hf",
]
