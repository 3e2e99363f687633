"""The critic's loss: PPO's clipped value loss, aggregated like the policy loss.

``0.5 * max((V - R)^2, (V_clip - R)^2)`` with ``V_clip = V_old + clip(V - V_old, -c, c)`` (the
PPO2 / NeMo-Aligner / verl form): the critic may not move a token's value further than ``c`` from
the rollout-time value in one update, unless that lowers its error. ``c = 0`` turns the clip off.
"""

from __future__ import annotations

import torch

from nemo_azr.algorithms.aggregation import aggregate_loss, masked_mean
from nemo_azr.errors import BatchContractError


def clipped_value_loss(
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    cliprange: float,
    loss_agg_mode: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: int | None = None,
    norm_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss and metrics from ``values/old_values/returns/loss_mask[B, T]``.

    The normalisers are the mini-batch's (as in ``policy_objective``), so micro-batch losses add up
    to the mini-batch loss. Metrics: ``critic/vf_loss`` (that sum), ``critic/vf_clipfrac`` (tokens
    where the clipped error is the larger one) and ``critic/vpred_mean``, means over this call's
    trained tokens.
    """
    for name, t in (("old_values", old_values), ("returns", returns), ("loss_mask", loss_mask)):
        if t.shape != values.shape:
            raise BatchContractError(
                f"clipped_value_loss: {name} is {list(t.shape)}, values is {list(values.shape)}"
            )
    old_values, returns = old_values.to(values.dtype), returns.to(values.dtype)
    error = (values - returns).square()
    if cliprange > 0:
        # clamp(values, old - c, old + c) is ``values`` itself inside the range; old + (values - old)
        # is not always (float rounding), and would count tokens inside the range as clipped
        clipped = torch.clamp(values, old_values - cliprange, old_values + cliprange)
        clipped_error = (clipped - returns).square()
        per_token = 0.5 * torch.maximum(error, clipped_error)
        clip_active = clipped_error > error
    else:
        per_token = 0.5 * error
        clip_active = torch.zeros_like(error, dtype=torch.bool)
    loss = aggregate_loss(
        per_token, loss_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": float(loss),
            "critic/vf_clipfrac": float(masked_mean(clip_active.to(values.dtype), loss_mask)),
            "critic/vpred_mean": float(masked_mean(values.detach(), loss_mask)),
        }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the trained tokens of ``[B, T]`` tensors: 1 for a perfect
    critic, 0 for one that predicts the mean return, negative for a worse one (nan when the returns
    are constant)."""
    keep = mask.bool()
    r, v = returns[keep].double(), values[keep].double()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
