"""Chunked token log-probs in pure torch: the full ``[N, V]`` matrix is never held at once.

Two entry points, both ``torch.autograd.Function`` s with hand-written backward passes:

* :func:`linear_token_logprobs_torch` fuses the LM head: it takes the last hidden states and the
  output-embedding weight and walks the tokens ``chunk_size`` at a time. The forward keeps only
  the per-token logsumexp (``O(N)``); the backward recomputes each chunk's logits. Peak extra
  memory is ``O(chunk_size * V)`` in both passes (plus the ``[V, H]`` weight gradient).
* :func:`token_logprobs_torch` is for callers that already hold logits. It avoids the full-size
  ``log_softmax`` output and float32 upcast, and writes ``d logits`` chunk by chunk into the one
  unavoidable ``[N, V]`` gradient buffer.

Numerics: everything after the matmul (logsumexp, softmax, gradients of the logits) runs in
float32 (float64 for float64 inputs, so that ``gradcheck`` works). For float32/float64 inputs the
matmul itself is done in that dtype. For bfloat16/float16 inputs the LM-head matmul runs in the
input dtype (fp32 accumulation inside the GEMM, output rounded to the input dtype, i.e. exactly the
logits a bf16 ``lm_head`` would produce) and is then upcast per chunk; this avoids a full float32
copy of the ``[V, H]`` weight. The weight gradient of low-precision inputs is accumulated over
chunks in a float32 ``[V, H]`` buffer and cast once at the end.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["linear_token_logprobs_torch", "token_logprobs_torch"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_common(targets: torch.Tensor, n: int, temperature: float, chunk_size: int) -> None:
    if targets.dim() != 1 or targets.shape[0] != n:
        raise ValueError(f"targets must have shape [{n}], got {tuple(targets.shape)}")
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"targets must be an integer tensor, got {targets.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _linear_chunk_logits(
    hidden_c: torch.Tensor, weight: torch.Tensor, temperature: float, cdt: torch.dtype
) -> torch.Tensor:
    """Fresh (safe to modify in place) ``[c, V]`` logits of one chunk, in ``cdt``, divided by T."""
    z = (hidden_c @ weight.t()).to(cdt)  # a new tensor either way (matmul output / upcast copy)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _scaled_dlogits_(p: torch.Tensor, t_c: torch.Tensor, g_c: torch.Tensor, temperature: float) -> None:
    """In place: softmax ``p`` -> ``g * (onehot(t) - p) / T`` (d logprob / d raw logits)."""
    gs = g_c / temperature
    p.mul_(-gs.unsqueeze(1))
    p.scatter_add_(1, t_c.unsqueeze(1), gs.unsqueeze(1))


class _LinearTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, ignore_index, return_entropy):
        n = hidden.shape[0]
        cdt = _compute_dtype(hidden.dtype)
        ignored = targets == ignore_index
        safe_t = targets.masked_fill(ignored, 0).long()
        lse = torch.empty(n, dtype=cdt, device=hidden.device)
        logprobs = torch.empty(n, dtype=cdt, device=hidden.device)
        entropy = torch.empty(n, dtype=cdt, device=hidden.device) if return_entropy else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _linear_chunk_logits(hidden[s:e], weight, temperature, cdt)
            lse_c = torch.logsumexp(z, dim=-1)
            lse[s:e] = lse_c
            logprobs[s:e] = z.gather(1, safe_t[s:e].unsqueeze(1)).squeeze(1) - lse_c
            if entropy is not None:
                # H = lse - sum_v p_v z_v ; reuse z's buffer for p * z.
                p = (z - lse_c.unsqueeze(1)).exp_()
                entropy[s:e] = lse_c - p.mul_(z).sum(dim=-1)
            del z
        logprobs.masked_fill_(ignored, 0.0)
        ctx.save_for_backward(hidden, weight, safe_t, ignored, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        if entropy is None:
            return logprobs
        entropy.masked_fill_(ignored, 0.0)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs, *_grad_entropy):
        hidden, weight, safe_t, ignored, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_h or need_w):
            return None, None, None, None, None, None, None
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        n = hidden.shape[0]
        cdt = _compute_dtype(hidden.dtype)
        low_precision = weight.dtype != cdt
        g = grad_logprobs.to(cdt).masked_fill(ignored, 0.0)
        grad_hidden = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_h else None
        grad_w_acc = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            h_c = hidden[s:e]
            p = _linear_chunk_logits(h_c, weight, temperature, cdt)
            p.sub_(lse[s:e].unsqueeze(1)).exp_()
            _scaled_dlogits_(p, safe_t[s:e], g[s:e], temperature)  # p is now d logprob / d logits
            if need_h:
                # Low precision: cast the chunk's dlogits down and use the input-dtype GEMM (fp32
                # accumulation inside), avoiding a float32 copy of the whole weight.
                torch.mm(p.to(weight.dtype) if low_precision else p, weight, out=grad_hidden[s:e])
            if need_w:
                grad_w_acc.addmm_(p.t(), h_c.to(cdt) if low_precision else h_c)
            del p
        grad_weight = None
        if need_w:
            grad_weight = grad_w_acc.to(weight.dtype) if low_precision else grad_w_acc
        return grad_hidden, grad_weight, None, None, None, None, None


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_size, ignore_index, return_entropy):
        n = logits.shape[0]
        cdt = _compute_dtype(logits.dtype)
        ignored = targets == ignore_index
        safe_t = targets.masked_fill(ignored, 0).long()
        lse = torch.empty(n, dtype=cdt, device=logits.device)
        logprobs = torch.empty(n, dtype=cdt, device=logits.device)
        entropy = torch.empty(n, dtype=cdt, device=logits.device) if return_entropy else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = logits[s:e].to(cdt)  # may alias the input: never modified in place
            if temperature != 1.0:
                z = z / temperature
            lse_c = torch.logsumexp(z, dim=-1)
            lse[s:e] = lse_c
            logprobs[s:e] = z.gather(1, safe_t[s:e].unsqueeze(1)).squeeze(1) - lse_c
            if entropy is not None:
                p = (z - lse_c.unsqueeze(1)).exp_()
                entropy[s:e] = lse_c - p.mul_(z).sum(dim=-1)
            del z
        logprobs.masked_fill_(ignored, 0.0)
        ctx.save_for_backward(logits, safe_t, ignored, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        if entropy is None:
            return logprobs
        entropy.masked_fill_(ignored, 0.0)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs, *_grad_entropy):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        logits, safe_t, ignored, lse = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        n = logits.shape[0]
        cdt = _compute_dtype(logits.dtype)
        g = grad_logprobs.to(cdt).masked_fill(ignored, 0.0)
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            p = logits[s:e].to(cdt, copy=True)
            if temperature != 1.0:
                p.div_(temperature)
            p.sub_(lse[s:e].unsqueeze(1)).exp_()
            _scaled_dlogits_(p, safe_t[s:e], g[s:e], temperature)
            grad_logits[s:e].copy_(p)
            del p
        return grad_logits, None, None, None, None, None


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
    """``log softmax(hidden @ weight.T / T)[i, targets[i]]`` for ``hidden [N, H]``, ``weight [V, H]``.

    Returns float32 log-probs ``[N]`` (float64 for float64 inputs); rows whose target is
    ``ignore_index`` get 0 and no gradient. With ``return_entropy`` also returns the per-token
    entropy of the tempered distribution (no gradient). Gradients flow to ``hidden`` and ``weight``
    (in their dtype) without ever materialising the ``[N, V]`` logits: peak extra memory is
    ``O(chunk_size * V)``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight must share a dtype, got {hidden.dtype} and {weight.dtype}")
    _check_common(targets, hidden.shape[0], temperature, chunk_size)
    return _LinearTokenLogprobs.apply(
        hidden, weight, targets, float(temperature), int(chunk_size), int(ignore_index), bool(return_entropy)
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
    """``log_softmax(logits / T)[i, targets[i]]`` for ``logits [N, V]``, computed chunk-wise.

    Same conventions as :func:`linear_token_logprobs_torch`. The gradient w.r.t. ``logits`` is one
    ``[N, V]`` buffer in the logits' dtype, filled chunk by chunk; no other full-size temporary is
    created in forward or backward.
    """
    if logits.dim() != 2:
        raise ValueError(f"expected logits [N, V], got {tuple(logits.shape)}")
    _check_common(targets, logits.shape[0], temperature, chunk_size)
    return _TokenLogprobs.apply(
        logits, targets, float(temperature), int(chunk_size), int(ignore_index), bool(return_entropy)
    )
