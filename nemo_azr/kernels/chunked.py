"""Chunked token log-probs: the full ``[N, V]`` matrix is never held at once (any row-ops backend).

Two ``torch.autograd.Function`` s with hand-written backward passes, generic over the row-ops
backend of :mod:`nemo_azr.kernels.row_ops` (pure torch, or the Triton kernels) and, optionally, over
a vocab-parallel process group:

* :class:`_LinearTokenLogprobs` fuses the LM head: it takes the last hidden states and the
  output-embedding weight (or its vocab shard) and walks the tokens ``chunk_size`` at a time. The
  forward keeps only per-token ``lse`` and entropy (``O(N)``); the backward recomputes each chunk's
  logits and the row ops write ``d logits`` into that same buffer. Peak extra memory is
  ``O(chunk_size * V)`` in both passes (plus the ``[V, H]`` weight gradient).
* :class:`_TokenLogprobs` is for callers that already hold logits. No log-softmax copy or full
  float32 upcast in the forward; ``d logits`` is written chunk by chunk into the one unavoidable
  ``[N, V]`` gradient buffer (the Triton backend streams every row, so it needs no chunks).

Both return float32 log-probs (float64 for float64 inputs) and, optionally, the differentiable
entropy of the tempered distribution. Rows whose target is ``ignore_index`` give 0 and no gradient.

Vocab parallel: with ``group`` each rank passes its vocab shard (logits ``[N, V/P]`` or weight
``[V/P, H]``) starting at global id ``vocab_start``; the per-row partials are combined by
:func:`nemo_azr.kernels.row_ops.combine` (one MAX and one SUM all-reduce for the whole forward) and
the backward of the logits needs no communication. The hidden-state gradient of the linear variant
is a sum over vocab shards: it is all-reduced over ``group`` unless ``reduce_hidden_grad=False``
(use that when the caller's column-parallel layer already reduces it, as Megatron's does).

Numerics: everything after the matmul runs in float32 (float64 for float64 inputs). For
bfloat16/float16 inputs the LM-head matmul runs in the input dtype (exactly the logits a bf16
``lm_head`` would produce) and is upcast per chunk; the hidden gradient uses the input-dtype GEMM,
the weight gradient is accumulated over chunks in a float32 ``[V, H]`` buffer and cast once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from nemo_azr.kernels.row_ops import (
    RowPartials,
    TorchRowOps,
    combine,
    compute_dtype,
    local_targets,
    shard_index,
)

__all__ = [
    "linear_token_logprobs_chunked",
    "linear_token_logprobs_torch",
    "token_logprobs_chunked",
    "token_logprobs_torch",
]


def _check_common(targets: torch.Tensor, n: int, temperature: float, chunk_size: int) -> None:
    if targets.dim() != 1 or targets.shape[0] != n:
        raise ValueError(f"targets must have shape [{n}], got {tuple(targets.shape)}")
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"targets must be an integer tensor, got {targets.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def chunk_logits(hidden_c: torch.Tensor, weight: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """Fresh (safe to modify in place) raw ``[c, V]`` logits of one chunk in ``cdt``."""
    return (hidden_c @ weight.t()).to(cdt)  # a new tensor either way (matmul output / upcast copy)


def empty_partials(device: torch.device, cdt: torch.dtype, need_w: bool) -> RowPartials:
    e = torch.empty(0, dtype=cdt, device=device)
    return RowPartials(m=e, s=e, w=e if need_w else None, tgt=e)


def _ranges(n: int, step: int):
    for s in range(0, n, step):
        yield s, min(s + step, n)


def _masked_grads(ctx, grad_logprobs, grad_entropy, ignored, cdt):
    g = torch.zeros(ignored.shape, dtype=cdt, device=ignored.device)
    if grad_logprobs is not None:
        g = grad_logprobs.to(cdt).masked_fill(ignored, 0.0)
    ge = None
    if ctx.return_entropy and grad_entropy is not None:
        ge = grad_entropy.to(cdt).masked_fill(ignored, 0.0)
    return g, ge


def _outputs(ctx, stats, ignored):
    logprobs = stats.logp.masked_fill(ignored, 0.0)
    if stats.entropy is None:
        return logprobs
    return logprobs, stats.entropy.masked_fill(ignored, 0.0)


class _LinearTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        targets,
        temperature,
        chunk_size,
        ignore_index,
        return_entropy,
        ops,
        group,
        vocab_start,
        reduce_hidden_grad,
    ):
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        cdt = compute_dtype(hidden.dtype)
        inv_temp = 1.0 / temperature
        ignored = targets == ignore_index
        t_local = local_targets(targets, ignored, vocab_start)
        parts = [empty_partials(hidden.device, cdt, return_entropy)]
        for s, e in _ranges(n, chunk_size):
            z = chunk_logits(hidden[s:e], weight, cdt)
            parts.append(ops.stats(z, t_local[s:e], inv_temp, return_entropy, inplace=True)[0])
            del z
        stats = combine(RowPartials.cat(parts), group)
        entropy = stats.entropy if return_entropy else None
        ctx.save_for_backward(hidden, weight, t_local, ignored, stats.lse, entropy)
        ctx.inv_temp, ctx.chunk_size, ctx.ops, ctx.group = inv_temp, chunk_size, ops, group
        ctx.return_entropy, ctx.reduce_hidden_grad = return_entropy, reduce_hidden_grad
        return _outputs(ctx, stats, ignored)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy=None):
        hidden, weight, t_local, ignored, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        nones = (None,) * 9
        if not (need_h or need_w):
            return (None, None, *nones)
        cdt = compute_dtype(hidden.dtype)
        g, ge = _masked_grads(ctx, grad_logprobs, grad_entropy, ignored, cdt)
        ent = entropy if ge is not None else None
        grad_hidden, grad_weight = linear_backward(
            hidden, weight, t_local, lse, ent, g, ge, ctx.inv_temp, ctx.chunk_size, ctx.ops, need_h, need_w
        )
        if need_h and ctx.group is not None and ctx.reduce_hidden_grad:
            dist.all_reduce(grad_hidden, group=ctx.group)
        return (grad_hidden, grad_weight, *nones)


def linear_backward(hidden, weight, t_local, lse, ent, g, ge, inv_temp, chunk_size, ops, need_h, need_w):
    """Recompute each chunk's logits, turn them into ``d logits`` in place, and do the two GEMMs."""
    n = hidden.shape[0]
    cdt = compute_dtype(hidden.dtype)
    low_precision = weight.dtype != cdt
    grad_hidden = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_h else None
    grad_w_acc = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
    for s, e in _ranges(n, chunk_size):
        h_c = hidden[s:e]
        z = chunk_logits(h_c, weight, cdt)
        ops.dlogits(
            z,
            t_local[s:e],
            inv_temp,
            lse[s:e],
            None if ent is None else ent[s:e],
            g[s:e],
            None if ge is None else ge[s:e],
            inv_temp,
            z,
            onehot=False,
        )
        apply_dlogits(z, h_c, weight, grad_hidden, grad_w_acc, s, e, t_local[s:e], g[s:e] * inv_temp)
        del z
    grad_weight = None
    if need_w:
        grad_weight = grad_w_acc.to(weight.dtype) if low_precision else grad_w_acc
    return grad_hidden, grad_weight


def apply_dlogits(dz, h_c, weight, grad_hidden, grad_w_acc, s, e, t_local_c, g_target):
    """One chunk's GEMMs: ``grad_hidden[s:e] = dZ @ W`` and ``grad_w_acc += dZ.T @ h_c``.

    ``dz [c, V]`` holds ``d logits`` without the target term (``dlogits(..., onehot=False)``);
    ``dZ = dz + g_target onehot(t)`` is applied here as ``g W[t]`` and an ``index_add`` of ``g h``.
    """
    cdt = dz.dtype
    low_precision = weight.dtype != cdt
    inside, idx = shard_index(t_local_c, weight.shape[0])
    g_t = (g_target * inside).to(cdt).unsqueeze(1)
    if grad_hidden is not None:
        # Low precision: cast the chunk's dlogits down and use the input-dtype GEMM (fp32
        # accumulation inside), avoiding a float32 copy of the whole weight.
        if low_precision:
            gh = torch.mm(dz.to(weight.dtype), weight).to(cdt)
            grad_hidden[s:e] = gh.add_(weight[idx].to(cdt) * g_t)
        else:
            torch.mm(dz, weight, out=grad_hidden[s:e])
            grad_hidden[s:e].add_(weight[idx] * g_t)
    if grad_w_acc is not None:
        h32 = h_c.to(cdt) if low_precision else h_c
        grad_w_acc.addmm_(dz.t(), h32)
        grad_w_acc.index_add_(0, idx, h32 * g_t)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, targets, temperature, chunk_size, ignore_index, return_entropy, ops, group, vocab_start
    ):
        ctx.set_materialize_grads(False)
        n = logits.shape[0]
        cdt = compute_dtype(logits.dtype)
        inv_temp = 1.0 / temperature
        ignored = targets == ignore_index
        t_local = local_targets(targets, ignored, vocab_start)
        step = chunk_size if ops.chunk_rows else max(n, 1)
        parts = [empty_partials(logits.device, cdt, return_entropy)]
        for s, e in _ranges(n, step):
            # inplace=False: the caller's logits are never modified
            parts.append(ops.stats(logits[s:e], t_local[s:e], inv_temp, return_entropy, inplace=False)[0])
        stats = combine(RowPartials.cat(parts), group)
        entropy = stats.entropy if return_entropy else None
        ctx.save_for_backward(logits, t_local, ignored, stats.lse, entropy)
        ctx.inv_temp, ctx.step, ctx.ops, ctx.return_entropy = inv_temp, step, ops, return_entropy
        return _outputs(ctx, stats, ignored)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy=None):
        nones = (None,) * 8
        if not ctx.needs_input_grad[0]:
            return (None, *nones)
        logits, t_local, ignored, lse, entropy = ctx.saved_tensors
        cdt = compute_dtype(logits.dtype)
        g, ge = _masked_grads(ctx, grad_logprobs, grad_entropy, ignored, cdt)
        ent = entropy if ge is not None else None
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for s, e in _ranges(logits.shape[0], ctx.step):
            ctx.ops.dlogits(
                logits[s:e],
                t_local[s:e],
                ctx.inv_temp,
                lse[s:e],
                None if ent is None else ent[s:e],
                g[s:e],
                None if ge is None else ge[s:e],
                ctx.inv_temp,
                grad_logits[s:e],
            )
        return (grad_logits, *nones)


def _check_linear(hidden: torch.Tensor, weight: torch.Tensor) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight must share a dtype, got {hidden.dtype} and {weight.dtype}")


def linear_token_logprobs_chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ops=TorchRowOps,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    ignore_index: int = -100,
    return_entropy: bool = False,
    group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
    reduce_hidden_grad: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(hidden @ weight.T / T)[i, targets[i]]`` for ``hidden [N, H]``, ``weight [V, H]``.

    ``ops`` is a row-ops backend (:class:`~nemo_azr.kernels.row_ops.TorchRowOps` or
    :class:`~nemo_azr.kernels.triton_logprobs.TritonRowOps`); ``group`` / ``vocab_start``: see the
    module docstring. With ``return_entropy`` also returns the (differentiable) entropy ``[N]``.
    """
    _check_linear(hidden, weight)
    _check_common(targets, hidden.shape[0], temperature, chunk_size)
    return _LinearTokenLogprobs.apply(
        hidden,
        weight,
        targets,
        float(temperature),
        int(chunk_size),
        int(ignore_index),
        bool(return_entropy),
        ops,
        group,
        int(vocab_start),
        bool(reduce_hidden_grad),
    )


def token_logprobs_chunked(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    ops=TorchRowOps,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    ignore_index: int = -100,
    return_entropy: bool = False,
    group: dist.ProcessGroup | None = None,
    vocab_start: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits / T)[i, targets[i]]`` for ``logits [N, V]`` (or a vocab shard of them)."""
    if logits.dim() != 2:
        raise ValueError(f"expected logits [N, V], got {tuple(logits.shape)}")
    _check_common(targets, logits.shape[0], temperature, chunk_size)
    return _TokenLogprobs.apply(
        logits,
        targets,
        float(temperature),
        int(chunk_size),
        int(ignore_index),
        bool(return_entropy),
        ops,
        group,
        int(vocab_start),
    )


def linear_token_logprobs_torch(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    ignore_index: int = -100,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The pure-torch :func:`linear_token_logprobs_chunked`: float32 log-probs ``[N]``, ``O(chunk x V)`` memory.

    Rows whose target is ``ignore_index`` get 0 and no gradient. With ``return_entropy`` also
    returns the per-token entropy of the tempered distribution (differentiable). Gradients flow to
    ``hidden`` and ``weight`` (in their dtype) without ever materialising the ``[N, V]`` logits.
    """
    return linear_token_logprobs_chunked(
        hidden,
        weight,
        targets,
        temperature=temperature,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        return_entropy=return_entropy,
    )


def token_logprobs_torch(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    ignore_index: int = -100,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The pure-torch :func:`token_logprobs_chunked`: ``log_softmax(logits / T)[i, targets[i]]``.

    The gradient w.r.t. ``logits`` is one ``[N, V]`` buffer in the logits' dtype, filled chunk by
    chunk; no other full-size temporary is created in forward or backward.
    """
    return token_logprobs_chunked(
        logits,
        targets,
        temperature=temperature,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        return_entropy=return_entropy,
    )
