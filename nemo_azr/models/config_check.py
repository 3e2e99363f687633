"""Config checks of the model backends' layouts (packing, shared prefixes; ``nemo_azr.preflight`` runs them)."""

from __future__ import annotations

from nemo_azr.config.checks import require
from nemo_azr.config.schema import NemoAzrConfig


def check_throughput_config(cfg: NemoAzrConfig, megatron: bool) -> None:
    """Packing, token-budget micro-batches (docs/throughput.md)."""
    alg = cfg.algorithm
    require(
        alg.max_tokens_per_microbatch >= 0,
        f"algorithm.max_tokens_per_microbatch must be >= 0 (0: micro_batch_size rows), got {alg.max_tokens_per_microbatch}",
    )
    require(
        alg.logprob_micro_batch_size >= 0,
        "algorithm.logprob_micro_batch_size must be >= 0 (0: the training micro-batches), "
        f"got {alg.logprob_micro_batch_size}",
    )
    # Packed (thd) sequences need TransformerEngine's attention; megatron's local one refuses them
    # (docs/decisions.md). Token-budget micro-batches work on both backends.
    require(
        not (cfg.model.sequence_packing and megatron),
        "model.sequence_packing=true is for model.backend=hf: megatron runs packed sequences only "
        "with TransformerEngine's attention (its local attention refuses them), which this backend "
        "does not wire up; use algorithm.max_tokens_per_microbatch (token-budget micro-batches)",
    )
    m = cfg.model
    if m.shared_prefix:
        require(not megatron, "model.shared_prefix=true is for model.backend=hf")
        require(
            not m.sequence_packing,
            "model.shared_prefix=true and model.sequence_packing=true are two layouts of the same "
            "forward: choose one (shared prefixes for many rows per prompt, packing for ragged lengths)",
        )
        require(
            not m.gradient_checkpointing,
            "model.shared_prefix=true keeps the prefix's KV cache for the rows that share it, which "
            "transformers turns off under gradient checkpointing: set model.gradient_checkpointing=false",
        )
