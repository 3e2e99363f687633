"""How many tokens one no-grad forward (old / reference log-probs, values) takes on a GPU by default.

A no-grad pass keeps no activations: only one decoder layer's temporaries are alive at a time, and the
log-prob head walks token chunks of its own size (``model.logprob_chunk_size``). So it fits far more
rows than a training micro-batch, and on a GPU fewer, larger forwards pay the per-layer host cost
(kernel launches, megatron's autograd wrappers) fewer times: on an H200, Qwen2-0.5B shape, 32 rows per
forward ran the megatron log-prob pass 4x and the hf one 2.4x faster than the training micro-batch of
4 (results/megatron_tokens_per_s_h200_round2.md). ``algorithm.logprob_micro_batch_size=0`` (the
default) therefore groups the rows of a no-grad pass on CUDA by the token budget below; on a CPU, where
launches are cheap and memory is shared with everything else, it keeps the training micro-batches.
"""

from __future__ import annotations

import torch

#: The most bytes one decoder layer's no-grad temporaries may take (capped at a quarter of the free
#: device memory: the optimizer states and the rollout's cache live beside them).
NO_GRAD_BUDGET_BYTES = 4 * 1024**3


def activation_bytes_per_token(config, dtype_bytes: int) -> int:
    """Bytes one token holds alive inside a decoder layer during a no-grad forward.

    The residual stream and the normed input (2 x hidden), the q/k/v projections, the attention output
    and its projection (2 x hidden + 2 x kv width), and the gated MLP's gate, up and product
    (3 x intermediate), in the model's dtype; attention runs through SDPA (no [L, L] scores).
    """
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_width = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return (4 * hidden + 2 * kv_width + 3 * intermediate) * dtype_bytes


def no_grad_token_budget(config, dtype_bytes: int, device: torch.device) -> int:
    """Tokens per no-grad forward on ``device`` (a CUDA device): the layer temporaries of
    :func:`activation_bytes_per_token` under ``NO_GRAD_BUDGET_BYTES`` or a quarter of the free memory."""
    free, _ = torch.cuda.mem_get_info(device)
    budget = min(NO_GRAD_BUDGET_BYTES, free // 4)
    return max(1, budget // activation_bytes_per_token(config, dtype_bytes))


__all__ = ["NO_GRAD_BUDGET_BYTES", "activation_bytes_per_token", "no_grad_token_budget"]
