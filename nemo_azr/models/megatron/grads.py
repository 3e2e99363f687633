"""Gradient collectives of the megatron backend: data-parallel sum, tied-embedding sum, global norm.

Hand-written rather than megatron's ``DistributedDataParallel`` + ``finalize_model_grads``: those
keep gradients in ``param.main_grad`` buffers and expect megatron's optimizer, while this backend
steps a plain torch AdamW on ``param.grad`` (exact parity with the ``hf`` backend, CPU/gloo runs).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

__all__ = [
    "all_reduce_data_parallel_grads",
    "all_reduce_sequence_parallel_grads",
    "all_reduce_tied_embedding_grads",
    "model_grad_norm",
]

#: Elements per all-reduce bucket (float32: 100 MiB): bounds the flattened copy's memory.
BUCKET_ELEMENTS = 25 * 2**20


def all_reduce_data_parallel_grads(params: Iterable[torch.nn.Parameter], group) -> None:
    """Sum ``.grad`` over the data-parallel ``group`` in flattened buckets.

    A rank without rows has no gradients: they count as zeros (every rank must join each bucket).
    """
    trainable = [p for p in params if p.requires_grad]
    for p in trainable:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in trainable:
        bucket.append(p.grad)
        size += p.grad.numel()
        if size >= BUCKET_ELEMENTS:
            _reduce_bucket(bucket, group)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, group)


def _reduce_bucket(grads: list[torch.Tensor], group) -> None:
    flat = torch._utils._flatten_dense_tensors(grads)  # contiguous (gloo needs it)
    dist.all_reduce(flat, group=group)
    for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


def all_reduce_tied_embedding_grads(chunks: list[torch.nn.Module]) -> None:
    """With pipeline parallelism and tied embeddings the first stage's input embedding and the last
    stage's output layer are one weight held twice: sum their gradients (megatron's embedding group)."""
    from megatron.core import parallel_state as ps

    if (
        not ps.is_rank_in_embedding_group(ignore_virtual=True)
        or ps.get_pipeline_model_parallel_world_size() == 1
    ):
        return
    for chunk in chunks:
        if not chunk.share_embeddings_and_output_weights:
            continue
        if not (chunk.pre_process or chunk.post_process):
            continue
        weight = chunk.shared_embedding_or_output_weight()
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=ps.get_embedding_group())
        return  # one copy per rank (with virtual stages the first/last chunk holds it)


def all_reduce_sequence_parallel_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """With sequence parallelism each tensor-parallel rank normalises only its slice of the sequence,
    so the replicated norm weights (megatron marks them ``sequence_parallel``) hold partial
    gradients: sum them over the tensor-parallel group (megatron's ``_allreduce_layernorm_grads``)."""
    from megatron.core import parallel_state as ps

    grads = [p.grad for p in params if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if grads and ps.get_tensor_model_parallel_world_size() > 1:
        _reduce_bucket(grads, ps.get_tensor_model_parallel_group())


def model_grad_norm(params: Iterable[torch.nn.Parameter]) -> float:
    """Global L2 gradient norm over the model-parallel (TP x PP) group: every tensor-parallel shard
    once, tensor-parallel replicas (norms) once, and the tied output-layer copy of the embedding not
    at all (megatron marks it ``shared``)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    sq = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None and param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p):
            sq += p.grad.detach().double().pow(2).sum().cpu()
    group = ps.get_model_parallel_group()
    if dist.get_world_size(group) > 1:
        dist.all_reduce(sq, group=group)
    return float(sq.sqrt())
