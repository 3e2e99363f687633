"""Memory-bounded per-token log-probabilities, entropy and the fused policy loss for RL.

Policy-gradient losses need ``log p(target_t | context)`` for every generated token. The naive
``log_softmax(logits, -1).gather(-1, targets)`` materialises the ``[N, V]`` logits, a float32 copy,
the ``[N, V]`` log-softmax output and, in the backward, ``[N, V]`` gradients of each. With a
vocabulary of V = 151936 that is ~0.6 MB per token per copy, so these temporaries, not the model,
dominate activation memory for long rollouts.

This package computes the same quantities while only ever holding ``chunk_size x V`` values:

* :func:`linear_token_logprobs` fuses the LM head: pass the final hidden states and the output
  embedding weight; logits are produced one token chunk at a time, only the per-token
  log-sum-exp (and entropy) is kept for the backward, and each chunk's logits are recomputed there.
  The ``[N, V]`` logits never exist. Prefer this whenever the model can return hidden states.
* :func:`token_logprobs` is for logits that already exist: no log-softmax copy or full float32
  upcast in the forward, and the gradient is written directly into a single ``[N, V]`` buffer.
* :func:`fused_linear_policy_loss` is ``policy_objective`` (PPO clip / dual clip, k3 KL, entropy
  bonus, every aggregation mode) fused with the LM head: one pass, three GEMMs, no recomputation.

All accept any leading shape (``[B, T, ...]``), return float32 log-probs, give 0 (and no gradient)
where ``targets == ignore_index`` and divide the logits by ``temperature`` first. With
``return_entropy`` they also return the entropy of the tempered distribution (differentiable).

Backends (``backend=``): ``"torch"`` (chunked PyTorch, any device), ``"triton"`` (Triton kernels
streaming each row with an online log-sum-exp; CUDA, or Triton's CPU interpreter when
``TRITON_INTERPRET=1``) and ``"auto"`` (triton when importable and the tensors are on CUDA or
``TRITON_INTERPRET`` is set, else torch). Vocab parallel: pass ``process_group`` and the local vocab
shard (logits ``[..., V/P]`` or weight ``[V/P, H]``); see :mod:`nemo_azr.kernels.chunked`.
:mod:`nemo_azr.kernels.reference` holds the naive versions used by tests and benchmarks; the math is
in ``docs/kernels.md``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nemo_azr.kernels.backend import BACKENDS, get_row_ops, resolve_backend
from nemo_azr.kernels.chunked import (
    linear_token_logprobs_chunked,
    linear_token_logprobs_torch,
    token_logprobs_chunked,
    token_logprobs_torch,
)
from nemo_azr.kernels.vocab_parallel import default_vocab_start

__all__ = [
    "BACKENDS",
    "fused_linear_policy_loss",
    "linear_token_logprobs",
    "linear_token_logprobs_chunked",
    "linear_token_logprobs_torch",
    "resolve_backend",
    "token_logprobs",
    "token_logprobs_chunked",
    "token_logprobs_torch",
]


def _check_leading(name: str, x: torch.Tensor, targets: torch.Tensor) -> None:
    if x.dim() < 1 or tuple(x.shape[:-1]) != tuple(targets.shape):
        raise ValueError(
            f"{name} shape {tuple(x.shape)} does not match targets shape {tuple(targets.shape)}: "
            f"expected {name} [..., D] with targets [...]"
        )


def _restore(out, shape):
    if isinstance(out, tuple):
        return tuple(o.reshape(shape) for o in out)
    return out.reshape(shape)


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    backend: str = "auto",
    chunk_size: int = 1024,
    ignore_index: int = -100,
    return_entropy: bool = False,
    process_group: dist.ProcessGroup | None = None,
    vocab_start: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits / temperature).gather(-1, targets)`` for ``logits [..., V]``, ``targets [...]``.

    Returns float32 ``[...]`` (and, with ``return_entropy``, the per-token entropy). With
    ``process_group``, ``logits`` is this rank's vocab shard ``[..., V/P]`` starting at global id
    ``vocab_start`` (default ``rank * V/P``); every rank gets the full-vocabulary result.
    """
    _check_leading("logits", logits, targets)
    ops = get_row_ops(resolve_backend(backend, logits))
    if vocab_start is None:
        vocab_start = default_vocab_start(logits.shape[-1], process_group)
    shape = targets.shape
    out = token_logprobs_chunked(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ops=ops,
        temperature=temperature,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        return_entropy=return_entropy,
        group=process_group,
        vocab_start=vocab_start,
    )
    return _restore(out, shape)


def linear_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    backend: str = "auto",
    chunk_size: int = 1024,
    ignore_index: int = -100,
    return_entropy: bool = False,
    process_group: dist.ProcessGroup | None = None,
    vocab_start: int | None = None,
    reduce_hidden_grad: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs of the LM head ``hidden [..., H] @ weight[V, H].T`` without ``[N, V]`` logits.

    Returns float32 ``[...]`` (and, with ``return_entropy``, the per-token entropy). Gradients flow
    to ``hidden`` and ``weight``. With ``process_group``, ``weight`` is this rank's vocab shard
    ``[V/P, H]`` (starting at ``vocab_start``, default ``rank * V/P``); the hidden gradient is
    all-reduced over the group unless ``reduce_hidden_grad=False``.
    """
    _check_leading("hidden", hidden, targets)
    ops = get_row_ops(resolve_backend(backend, hidden, weight))
    if vocab_start is None:
        vocab_start = default_vocab_start(weight.shape[0], process_group)
    shape = targets.shape
    out = linear_token_logprobs_chunked(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        targets.reshape(-1),
        ops=ops,
        temperature=temperature,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        return_entropy=return_entropy,
        group=process_group,
        vocab_start=vocab_start,
        reduce_hidden_grad=reduce_hidden_grad,
    )
    return _restore(out, shape)


def fused_linear_policy_loss(*args, **kwargs):
    """See :func:`nemo_azr.kernels.policy_loss.fused_linear_policy_loss` (imported on first use,
    so that ``nemo_azr.kernels`` does not import the algorithms package)."""
    from nemo_azr.kernels.policy_loss import fused_linear_policy_loss as impl

    return impl(*args, **kwargs)
