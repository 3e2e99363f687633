"""Vocab-parallel helpers: which slice of the vocabulary a rank of a tensor-parallel group holds.

The layout is Megatron's (``VocabUtility.vocab_range_from_per_partition_vocab_size``): the vocabulary
(padded to a multiple of the group size) is split into equal contiguous shards, rank ``r`` holding ids
``[r * V/P, (r + 1) * V/P)``. Any ``torch.distributed`` process group works: a plain gloo/nccl group or
megatron-core's tensor-model-parallel group (``parallel_state.get_tensor_model_parallel_group()``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nemo_azr.errors import ConfigError

__all__ = ["default_vocab_start", "vocab_shard", "vocab_shard_range"]


def vocab_shard_range(vocab_size: int, group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(start, end)`` of this rank's shard of a ``vocab_size`` vocabulary (the whole one without a group)."""
    if group is None:
        return 0, vocab_size
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if vocab_size % world:
        raise ConfigError(
            f"vocab size {vocab_size} is not divisible by the tensor-parallel size {world}; pad the "
            "vocabulary (Megatron's make_vocab_size_divisible_by) so every rank holds an equal shard"
        )
    per = vocab_size // world
    return rank * per, (rank + 1) * per


def vocab_shard(full: torch.Tensor, group: dist.ProcessGroup | None, dim: int = 0) -> torch.Tensor:
    """This rank's equal contiguous slice of ``full`` along ``dim`` (e.g. ``weight[V, H]`` -> ``[V/P, H]``)."""
    start, end = vocab_shard_range(full.shape[dim], group)
    return full.narrow(dim, start, end - start)


def default_vocab_start(local_vocab: int, group: dist.ProcessGroup | None) -> int:
    """Global id of this rank's first vocab entry when every rank holds ``local_vocab`` entries."""
    return 0 if group is None else dist.get_rank(group) * local_vocab
