"""Reduce a per-token loss ``loss_mat[B, T]`` to the scalar that is back-propagated.

Every mode is a sum over this call's rows divided by a normaliser of the WHOLE mini-batch
(``num_tokens`` / ``num_seqs``), so with gradient accumulation the sum of the micro-batch losses
equals the loss of the mini-batch exactly, whatever the micro-batch split. Left as ``None`` the
normalisers are this call's own counts (right when the call sees the whole mini-batch).
"""

from __future__ import annotations

import torch

from nemo_azr.errors import ConfigError

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values[B, T]`` over positions where ``mask[B, T]`` is non-zero (0 if there are none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: int | None = None,
    norm_length: int | None = None,
    eta: float = 0.0,
) -> torch.Tensor:
    """Scalar loss from ``loss_mat[B, T]`` and ``mask[B, T]`` (0/1, any dtype).

    * ``token-mean``: ``sum(l*m) / (num_tokens + eta)`` (``eta`` is RLCR's normaliser offset);
    * ``seq-mean-token-sum``: ``sum_i sum_t l*m / num_seqs``;
    * ``seq-mean-token-mean``: ``sum_i (sum_t l*m / max(sum_t m, 1)) / num_seqs``;
    * ``seq-mean-token-sum-norm`` (Dr. GRPO): ``sum(l*m) / (num_seqs * norm_length)``.

    ``num_tokens`` / ``num_seqs`` default to ``sum(mask)`` / ``B``. A zero normaliser gives a zero loss
    that is still connected to the graph, so ``backward()`` works on an empty micro-batch.
    """
    if mode not in AGG_MODES:
        raise ConfigError(f"unknown loss aggregation mode {mode!r}; known: {', '.join(AGG_MODES)}")
    m = mask.to(loss_mat.dtype)
    masked = loss_mat * m
    if num_seqs is None:
        num_seqs = loss_mat.shape[0]

    if mode == "token-mean":
        if num_tokens is None:
            num_tokens = float(m.sum())
        denominator = float(num_tokens) + eta
        numerator = masked.sum()
    elif mode == "seq-mean-token-sum":
        denominator = float(num_seqs)
        numerator = masked.sum()
    elif mode == "seq-mean-token-mean":
        denominator = float(num_seqs)
        # A row without trained tokens contributes 0 but still counts as a sequence.
        numerator = (masked.sum(-1) / m.sum(-1).clamp(min=1)).sum()
    else:  # seq-mean-token-sum-norm
        if norm_length is None or norm_length <= 0:
            raise ConfigError(
                "loss_agg_mode 'seq-mean-token-sum-norm' needs norm_length > 0 "
                "(algorithm.norm_length, or generation.max_new_tokens)"
            )
        denominator = float(num_seqs) * norm_length
        numerator = masked.sum()

    if denominator == 0:
        return masked.sum() * 0.0
    return numerator / denominator
