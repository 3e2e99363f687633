"""Sequence packing for the hf backend's training forward: a micro-batch's rows run as one sequence.

Padding wastes the decoder's compute on RL batches (short and long responses side by side). Packed,
only the real tokens run: rows are concatenated into bins as long as the longest row, position ids
restarting at 0 for each row, and no attention mask is passed. transformers then
finds the sequence boundaries from the position ids (``masking_utils.find_packed_sequence_indices``)
and builds attention that never crosses rows: a block-diagonal causal mask for sdpa/eager, varlen
kernels for flash attention. The hidden states are scattered back to ``[B, T, H]``, so log-probs,
losses, values and the Batch contract are those of the padded path (equal to fp32 tolerance).
"""

from __future__ import annotations

import torch

from nemo_azr.contracts.assemble import position_ids_from_mask
from nemo_azr.errors import BatchContractError
from nemo_azr.models.training.microbatch import token_budget_groups


def pack_layout(lengths: list[int]) -> tuple[int, int, list[int]]:
    """Bins for rows of ``lengths``: capacity = the longest row, rows placed first-fit decreasing.
    Returns (bins, capacity, each row's flat start ``bin x capacity + offset``)."""
    capacity = max(lengths)
    starts = [0] * len(lengths)
    for b, group in enumerate(token_budget_groups(lengths, capacity, packed=True)):
        offset = 0
        for row in group:
            starts[row] = b * capacity + offset
            offset += lengths[row]
    bins = max(s // capacity for s in starts) + 1
    return bins, capacity, starts


def packed_decoder_forward(
    decoder: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """``decoder``'s last hidden states ``[B, T, H]`` computed on the packed real tokens (0 on padding).

    Rows are packed into bins as long as the longest row (not one sequence of all the tokens): the
    attention of sdpa/eager on CPU is dense within a row, so a bin's cost grows with its length
    squared, and a bin no longer than the longest row costs no more than that row padded."""
    real = attention_mask.bool()
    if not bool((position_ids[real] == position_ids_from_mask(attention_mask)[real]).all()):
        # transformers reads a sequence boundary wherever a position does not follow the previous by 1.
        raise BatchContractError(
            "model.sequence_packing needs position ids that count each row's real tokens from 0 "
            "(contiguous real tokens); set model.sequence_packing=false for this data"
        )
    lengths = real.sum(dim=1).tolist()
    bins, capacity, starts = pack_layout(lengths)
    device = ids.device
    dest = torch.cat([torch.arange(s, s + n, device=device) for s, n in zip(starts, lengths)])
    flat_ids = torch.zeros(bins * capacity, dtype=ids.dtype, device=device)
    flat_ids[dest] = ids[real]
    # The unused tail of a bin is a sequence of its own (positions from 0): it sees only itself.
    used = torch.zeros(bins * capacity, dtype=torch.bool, device=device)
    used[dest] = True
    free_run = (~used).view(bins, capacity).long().cumsum(dim=1).view(-1) - 1
    flat_pos = torch.where(used, torch.zeros_like(free_run), free_run)
    flat_pos[dest] = position_ids[real]
    hidden = decoder(
        input_ids=flat_ids.view(bins, capacity),
        position_ids=flat_pos.view(bins, capacity),
        attention_mask=None,
        use_cache=False,
    ).last_hidden_state
    out = hidden.new_zeros(*ids.shape, hidden.shape[-1])
    out[real] = hidden.reshape(bins * capacity, -1)[dest]
    return out
