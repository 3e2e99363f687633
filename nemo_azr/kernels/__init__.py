"""Memory-bounded per-token log-probabilities for RL losses.

Policy-gradient losses need ``log p(target_t | context)`` for every generated token. The naive
``log_softmax(logits, -1).gather(-1, targets)`` materialises the ``[N, V]`` logits, a float32 copy,
the ``[N, V]`` log-softmax output and, in the backward, ``[N, V]`` gradients of each. With a
vocabulary of V = 151936 that is ~0.6 MB per token per copy, so these temporaries, not the model,
dominate activation memory for long rollouts.

This package computes the same quantity while only ever holding ``chunk_size x V`` values:

* :func:`linear_token_logprobs` fuses the LM head: pass the final hidden states and the output
  embedding weight; logits are produced one token chunk at a time, only the per-token logsumexp
  is kept for the backward, and each chunk's logits are recomputed there. The ``[N, V]`` logits
  never exist. Prefer this whenever the model can return hidden states.
* :func:`token_logprobs` is for logits that already exist (a model that returns logits): no
  log-softmax copy or full float32 upcast in the forward, and the gradient is written chunk-wise
  into a single ``[N, V]`` buffer.

Both accept any leading shape (``[B, T, ...]``), return float32 log-probs, give 0 (and no
gradient) where ``targets == ignore_index`` and divide the logits by ``temperature`` first.
Backends: ``"torch"`` (pure PyTorch, chunked; works on CPU and GPU) and ``"auto"`` (currently
always torch). ``"triton"`` is reserved for fused GPU kernels behind the same API.
:mod:`nemo_azr.kernels.reference` holds the naive versions used by tests and benchmarks.
"""

from __future__ import annotations

import torch

from nemo_azr.errors import ConfigError
from nemo_azr.kernels.chunked import linear_token_logprobs_torch, token_logprobs_torch

__all__ = [
    "BACKENDS",
    "linear_token_logprobs",
    "linear_token_logprobs_torch",
    "token_logprobs",
    "token_logprobs_torch",
]

BACKENDS = ("auto", "torch", "triton")


def _resolve_backend(backend: str) -> str:
    if backend == "triton":
        raise ConfigError("kernels backend 'triton' is not available yet; use backend='torch' or 'auto'")
    if backend in ("auto", "torch"):
        return "torch"
    raise ConfigError(f"unknown kernels backend {backend!r}; expected one of {', '.join(BACKENDS)}")


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits / temperature).gather(-1, targets)`` for ``logits [..., V]``, ``targets [...]``.

    Returns float32 ``[...]`` (and, with ``return_entropy``, the per-token entropy, without
    gradient).
    """
    _resolve_backend(backend)
    _check_leading("logits", logits, targets)
    shape = targets.shape
    out = token_logprobs_torch(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        temperature=temperature,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        return_entropy=return_entropy,
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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs of the LM head ``hidden [..., H] @ weight[V, H].T`` without ``[N, V]`` logits.

    Returns float32 ``[...]`` (and, with ``return_entropy``, the per-token entropy, without
    gradient). Gradients flow to ``hidden`` and ``weight``.
    """
    _resolve_backend(backend)
    _check_leading("hidden", hidden, targets)
    shape = targets.shape
    out = linear_token_logprobs_torch(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        targets.reshape(-1),
        temperature=temperature,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        return_entropy=return_entropy,
    )
    return _restore(out, shape)
