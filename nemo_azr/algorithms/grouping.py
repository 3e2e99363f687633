"""Per-group statistics over rows, with groups given by explicit per-row ids.

Rows of one prompt are never assumed to be adjacent (a batch may be shuffled, filtered or
concatenated from several sources): :func:`group_index` turns the ``group_id`` meta list into dense
integer ids and the helpers reduce with ``index_add`` instead of reshaping.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from nemo_azr.errors import BatchContractError


def group_index(ids: Sequence[Hashable], *, device: torch.device | str | None = None) -> torch.Tensor:
    """Dense group ids ``index[B]`` in ``0..G-1``, numbered by first occurrence: ``[a, b, a] -> [0, 1, 0]``."""
    dense: dict[Hashable, int] = {}
    try:
        # setdefault evaluates len(dense) before inserting, so a new id gets the next number.
        out = [dense.setdefault(i, len(dense)) for i in ids]
    except TypeError as exc:
        raise BatchContractError(f"group ids must be hashable (str, int, tuple): {exc}") from None
    return torch.tensor(out, dtype=torch.long, device=device)


def group_size(index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Rows per group ``size[G]`` (long) from ``index[B]``."""
    sizes = torch.zeros(num_groups, dtype=torch.long, device=index.device)
    return sizes.index_add_(0, index, torch.ones_like(index))


def group_sum(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group sum ``sum[G]`` of ``values[B]``."""
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, index, values)


def group_mean(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group mean ``mean[G]`` of ``values[B]`` (a group id with no rows gets 0)."""
    counts = group_size(index, num_groups).clamp(min=1).to(values.dtype)
    return group_sum(values, index, num_groups) / counts


def group_std(
    values: torch.Tensor, index: torch.Tensor, num_groups: int, mean: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-group population std ``std[G]`` (divides by G, not G-1) of ``values[B]``.

    Two-pass (deviations from the group mean) rather than ``E[x^2] - E[x]^2``, which cancels badly.
    """
    if mean is None:
        mean = group_mean(values, index, num_groups)
    deviation = values - mean[index]
    return group_mean(deviation * deviation, index, num_groups).sqrt()


def group_range(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group ``max - min`` ``range[G]`` of ``values[B]``; exactly 0 for constant or single-row groups."""
    fill_hi = torch.full((num_groups,), float("-inf"), dtype=values.dtype, device=values.device)
    fill_lo = torch.full((num_groups,), float("inf"), dtype=values.dtype, device=values.device)
    hi = fill_hi.scatter_reduce(0, index, values, reduce="amax")
    lo = fill_lo.scatter_reduce(0, index, values, reduce="amin")
    return hi - lo
