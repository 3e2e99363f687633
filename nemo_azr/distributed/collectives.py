"""The collectives a policy backend runs across its ranks, kept out of the model classes: broadcast a
state dict from one rank, gather rows that data-parallel ranks computed in stride, gather or
broadcast per-rank metric dicts. Groups are passed in (megatron's parallel state owns them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def broadcast_state_dict(state: dict[str, torch.Tensor] | None, *, src: int = 0) -> dict[str, torch.Tensor]:
    """``state`` (held by rank ``src``) on every rank: the key / shape / dtype list once, then each
    tensor. Collective: every rank calls it; the others pass None."""
    is_src = dist.get_rank() == src
    meta = [[(k, tuple(v.shape), v.dtype) for k, v in state.items()] if is_src else None]
    dist.broadcast_object_list(meta, src=src)
    out: dict[str, torch.Tensor] = {}
    for key, shape, dtype in meta[0]:
        t = state[key].contiguous() if is_src else torch.empty(shape, dtype=dtype)
        dist.broadcast(t, src=src)
        out[key] = t
    return out


def gather_strided_rows(local: torch.Tensor, num_rows: int, dp: int, group: Any) -> torch.Tensor:
    """Rows ``r, r + dp, ...`` computed on data-parallel rank ``r`` (``local``: ``[rows of r, T]``),
    reassembled in their original order on every rank of ``group``."""
    per_rank = -(-num_rows // dp)
    padded = torch.zeros(per_rank, local.shape[1], dtype=local.dtype)
    padded[: len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(dp)]
    dist.all_gather(parts, padded, group=group)
    out = torch.zeros(num_rows, local.shape[1], dtype=local.dtype)
    for r, part in enumerate(parts):
        idx = torch.arange(r, num_rows, dp)
        out[idx] = part[: len(idx)]
    return out


def gather_metric_dicts(metrics: dict[str, float], size: int, group: Any) -> list[dict[str, float]]:
    """Every rank's metric dict, on every rank of ``group`` (``size`` ranks)."""
    gathered: list[dict[str, float]] = [{} for _ in range(size)]
    dist.all_gather_object(gathered, dict(metrics), group=group)
    return gathered


def broadcast_metric_dict(metrics: dict[str, float], *, src: int, group: Any) -> dict[str, float]:
    """Rank ``src``'s metric dict on every rank of ``group`` (a pipeline's last stage has the loss)."""
    box = [dict(metrics)]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]
