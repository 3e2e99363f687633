"""Sequence packing for the hf backend's training forward: a micro-batch's rows run as one sequence.

Padding wastes the decoder's compute on RL batches (short and long responses side by side). Packed,
only the real tokens run: every row's real tokens are concatenated into one ``[1, N]`` sequence
whose position ids restart at 0 for each row, and no attention mask is passed. transformers then
finds the sequence boundaries from the position ids (``masking_utils.find_packed_sequence_indices``)
and builds attention that never crosses rows: a block-diagonal causal mask for sdpa/eager, varlen
kernels for flash attention. The hidden states are scattered back to ``[B, T, H]``, so log-probs,
losses, values and the Batch contract are those of the padded path (equal to fp32 tolerance).
"""

from __future__ import annotations

import torch

from nemo_azr.errors import BatchContractError
from nemo_azr.rollout.assemble import position_ids_from_mask


def packed_decoder_forward(
    decoder: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """``decoder``'s last hidden states ``[B, T, H]`` computed on the packed real tokens (0 on padding)."""
    real = attention_mask.bool()
    if not bool((position_ids[real] == position_ids_from_mask(attention_mask)[real]).all()):
        # transformers reads a sequence boundary wherever a position does not follow the previous by 1.
        raise BatchContractError(
            "model.sequence_packing needs position ids that count each row's real tokens from 0 "
            "(contiguous real tokens); set model.sequence_packing=false for this data"
        )
    hidden = decoder(
        input_ids=ids[real][None], position_ids=position_ids[real][None], attention_mask=None, use_cache=False
    ).last_hidden_state[0]
    out = hidden.new_zeros(*ids.shape, hidden.shape[-1])
    out[real] = hidden
    return out
