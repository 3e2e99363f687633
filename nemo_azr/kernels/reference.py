"""Naive token log-probs: the obviously-correct reference for tests and benchmarks.

These materialise the full ``[N, V]`` float32 log-softmax (and autograd keeps more of the same
size for the backward); never use them on real vocabularies in training code.
"""

from __future__ import annotations

import torch

__all__ = ["naive_entropy", "naive_linear_token_logprobs", "naive_token_logprobs"]


def naive_token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, ignore_index: int = -100
) -> torch.Tensor:
    """``log_softmax(logits.float() / T).gather(-1, targets)``; ``ignore_index`` targets give 0."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    ignored = targets == ignore_index
    safe = targets.masked_fill(ignored, 0).long()
    out = logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return out.masked_fill(ignored, 0.0)


def naive_linear_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """The LM head (``hidden @ weight.T``) followed by :func:`naive_token_logprobs`."""
    return naive_token_logprobs(hidden @ weight.t(), targets, temperature, ignore_index)


def naive_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits.float() / T)`` over the last dimension."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)
