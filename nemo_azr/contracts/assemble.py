"""Turn (prompt ids, generated samples) into the padded ``[B, T]`` tensors of the data contract.

Layout: ``[left-padded prompt | right-padded response]``, so every prompt ends at the same column
(what a decoder needs) and every response starts at the same column. ``loss_mask`` covers the
generated tokens only; ``rollout_logprobs`` sits on the same columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids[B, T]: 0 at the first real token of each row, counting real tokens only."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pack_prompt_response(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    response_logprobs: Sequence[Sequence[float]] | None,
    *,
    pad_id: int,
    response_masks: Sequence[Sequence[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """Tensors ``input_ids, attention_mask, position_ids, loss_mask[, rollout_logprobs]`` ``[B, P+R]``.

    ``response_masks`` (0/1 per response token) marks which response tokens the model generated;
    tokens an environment inserted between turns get ``loss_mask = 0``. Default: all generated.
    """
    b = len(prompts)
    p_len = max(len(p) for p in prompts)
    r_len = max(1, max(len(r) for r in responses))
    ids = torch.full((b, p_len + r_len), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_len + r_len), dtype=torch.long)
    loss = torch.zeros((b, p_len + r_len), dtype=torch.float32)
    logp = torch.zeros((b, p_len + r_len), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, p_len - len(p) : p_len] = torch.as_tensor(list(p), dtype=torch.long)
        attn[i, p_len - len(p) : p_len] = 1
        if r:
            ids[i, p_len : p_len + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            attn[i, p_len : p_len + len(r)] = 1
            if response_masks is None:
                loss[i, p_len : p_len + len(r)] = 1.0
            else:
                if len(response_masks[i]) != len(r):
                    raise ValueError(f"row {i}: {len(response_masks[i])} mask values for {len(r)} tokens")
                loss[i, p_len : p_len + len(r)] = torch.as_tensor(
                    list(response_masks[i]), dtype=torch.float32
                )
            if response_logprobs is not None:
                logp[i, p_len : p_len + len(r)] = torch.as_tensor(
                    list(response_logprobs[i]), dtype=torch.float32
                )
    out = {
        F.INPUT_IDS: ids,
        F.ATTENTION_MASK: attn,
        F.POSITION_IDS: position_ids_from_mask(attn),
        F.LOSS_MASK: loss,
    }
    if response_logprobs is not None:
        out[F.ROLLOUT_LOGPROBS] = logp
    return out


def rollout_logprob_gap(batch: Batch) -> dict[str, float]:
    """The engine's vs the trainer's log-probs of the same tokens (the train/inference mismatch):
    mean and max |rollout_logprobs - old_logprobs| over loss-masked tokens; {} without both."""
    if F.ROLLOUT_LOGPROBS not in batch.tensors or F.OLD_LOGPROBS not in batch.tensors:
        return {}
    mask = batch[F.LOSS_MASK] > 0
    if not bool(mask.any()):
        return {}
    gap = (batch[F.ROLLOUT_LOGPROBS].float() - batch[F.OLD_LOGPROBS].float().cpu()).abs()[mask]
    return {"generation/logprob_gap_mean": float(gap.mean()), "generation/logprob_gap_max": float(gap.max())}
