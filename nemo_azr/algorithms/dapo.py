"""DAPO's batch-level pieces (Yu et al. 2025): overlong reward shaping and dynamic sampling's filter.

The other two DAPO ingredients are settings of the core: clip-higher is ``algorithm.clip_ratio_high``
above ``clip_ratio_low`` and the token-level loss is ``loss_agg_mode=token-mean``
(``conf/algorithm/dapo.yaml``). The trainer runs the dynamic-sampling loop (trainer.py) with
:func:`informative_rows`.
"""

from __future__ import annotations

import torch

from nemo_azr.algorithms.grouping import group_index, group_range
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F


def overlong_penalty(
    lengths: torch.Tensor, *, max_len: int, buffer_len: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment ``[B]`` for response ``lengths[B]``: 0 up to
    ``max_len - buffer_len`` tokens, then falling linearly to ``-factor`` at ``max_len`` (and below
    it past ``max_len``)."""
    lengths = lengths.to(torch.float32)
    start = max_len - buffer_len
    penalty = (start - lengths) / buffer_len * factor
    return torch.where(lengths > start, penalty, torch.zeros_like(penalty))


def apply_overlong_penalty(batch: Batch, cfg: AlgorithmConfig, *, max_len: int) -> dict[str, float]:
    """Add the overlong penalty to ``rewards[B]`` (and to ``token_rewards`` at each row's last trained
    token when present); a row's length is its number of trained tokens (``loss_mask`` sum), the
    buffer ``round(overlong_buffer_frac x max_len)`` tokens (at least 1). No-op (``{}``) unless
    ``algorithm.overlong_buffer_frac > 0``."""
    if cfg.overlong_buffer_frac <= 0 or len(batch) == 0:
        return {}
    mask = batch[F.LOSS_MASK]
    lengths = mask.sum(-1)
    buffer_len = max(1, round(cfg.overlong_buffer_frac * max_len))
    penalty = overlong_penalty(
        lengths, max_len=max_len, buffer_len=buffer_len, factor=cfg.overlong_penalty_factor
    )
    batch[F.REWARDS] = batch[F.REWARDS] + penalty.to(batch[F.REWARDS].dtype)
    if F.TOKEN_REWARDS in batch.tensors:
        from nemo_azr.algorithms.advantages import rewards_at_last_token

        batch[F.TOKEN_REWARDS] = batch[F.TOKEN_REWARDS] + rewards_at_last_token(penalty, mask).to(
            batch[F.TOKEN_REWARDS].dtype
        )
    return {
        "dapo/overlong_penalty_mean": float(penalty.mean()),
        "dapo/overlong_frac": float((penalty < 0).float().mean()),
    }


def informative_rows(batch: Batch) -> list[int]:
    """Rows of the groups (``group_id``) whose rewards are not all equal: a group of equal rewards
    (all right or all wrong) has zero advantage under a group baseline and only dilutes the batch."""
    if len(batch) == 0:
        return []
    rewards = batch[F.REWARDS].to(torch.float64)
    index = group_index(batch.meta[F.GROUP_ID])
    spread = group_range(rewards, index, int(index.max()) + 1)[index] > 0
    return [i for i, keep in enumerate(spread.tolist()) if keep]


def num_groups(batch: Batch) -> int:
    return len(set(batch.meta.get(F.GROUP_ID, []))) if len(batch) else 0


def first_groups(batch: Batch, count: int) -> Batch:
    """The rows of the first ``count`` groups (in order of first appearance)."""
    keep: dict = {}
    for g in batch.meta[F.GROUP_ID]:
        if g not in keep and len(keep) < count:
            keep[g] = True
    return batch.index([i for i, g in enumerate(batch.meta[F.GROUP_ID]) if g in keep])


def retag_round(batch: Batch, round_index: int) -> Batch:
    """Make the ids of a re-sampling round unique within the step (workflows number groups per call)."""
    suffix = f"-ds{round_index}"
    for key in (F.UID, F.GROUP_ID, F.SUBGROUP_ID):
        if key in batch.meta:
            batch.meta[key] = [f"{v}{suffix}" for v in batch.meta[key]]
    return batch
