"""Off-policy correction with the rollout's log-probs: truncated (TIS) and masked (MIS) importance sampling.

The rollout policy ``mu`` (the generation engine's weights, possibly ``max_policy_lag`` updates old,
possibly another dtype or kernel) is not the policy ``pi_old`` whose log-probs the PPO ratio starts
from. The policy-gradient term is reweighted per token by ``w = pi_old / mu`` (decoupled PPO):

* ``tis`` (truncated IS, Yao et al. 2025): ``w = min(ratio, cap)``;
* ``mis`` (masked IS, Liu et al. 2025): ``w = ratio`` where ``ratio <= cap``, else 0: a sample the
  rollout policy made far too likely teaches nothing rather than being down-weighted;

with ``ratio`` per token, or per sequence (``exp`` of the row's summed log-ratio, the same weight on
every token of the row). Weights are constants (no gradient). The losses take the advantage as a
per-token factor and every shipped loss is positively homogeneous in it (``max(-A r, -A clip(r))``
scales with ``w >= 0``), so weighting the advantages weights each token's policy-gradient loss;
the KL and entropy terms are left alone.
"""

from __future__ import annotations

import torch

OFF_POLICY_CORRECTIONS = ("none", "tis", "mis")
IS_LEVELS = ("token", "sequence")
#: Log-ratios are clamped here before ``exp`` (a weight of e^20 is already far past any cap).
MAX_LOG_RATIO = 20.0


def _ratio_and_over(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
    level: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_ratio, ratio, over)`` ``[B, T]``: masked log-ratios, the per-token or per-sequence
    ratio, and where it exceeds ``cap`` (on the mask)."""
    log_ratio = (old_logprobs.detach().float() - rollout_logprobs.float()) * mask
    if level == "sequence":
        per_row = log_ratio.sum(dim=-1, keepdim=True).clamp(max=MAX_LOG_RATIO)
        ratio = per_row.exp().expand_as(log_ratio)
    elif level == "token":
        ratio = log_ratio.clamp(max=MAX_LOG_RATIO).exp()
    else:
        raise ValueError(f"unknown importance-sampling level {level!r}; expected token or sequence")
    return log_ratio, ratio, (ratio > cap) & mask


def _weights(
    ratio: torch.Tensor, over: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> torch.Tensor:
    if mode not in ("tis", "mis"):
        raise ValueError(f"unknown off-policy correction {mode!r}; expected tis or mis")
    weights = ratio.clamp(max=cap) if mode == "tis" else ratio.masked_fill(over, 0.0)
    return (weights * mask).detach()


def is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: str,
    cap: float,
    level: str = "token",
) -> torch.Tensor:
    """The importance weights of :func:`rollout_is_weights` alone: no metrics, so no host sync
    (the fused loss calls it once per token chunk). Any leading shape; the last dim is the row's tokens."""
    mask = loss_mask > 0
    _, ratio, over = _ratio_and_over(old_logprobs, rollout_logprobs, mask, cap=cap, level=level)
    return _weights(ratio, over, mask, mode, cap)


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: str,
    cap: float,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights ``[B, T]`` (0 off the loss mask) and their metrics (means over the
    trained tokens; ``masked_frac`` / ``clipped_frac`` of sequences with ``level="sequence"``)."""
    mask = loss_mask > 0
    log_ratio, ratio, over = _ratio_and_over(old_logprobs, rollout_logprobs, mask, cap=cap, level=level)
    weights = _weights(ratio, over, mask, mode, cap)
    n = max(int(mask.sum()), 1)
    if level == "sequence":
        rows = mask.any(dim=1)
        over_frac = float(over.any(dim=1)[rows].float().mean()) if bool(rows.any()) else 0.0
    else:
        over_frac = float(over.sum()) / n
    metrics = {
        "off_policy/is_weight_mean": float(weights.sum()) / n,
        "off_policy/is_weight_max": float(weights.max()) if bool(mask.any()) else 0.0,
        "off_policy/is_ratio_max": float(ratio[mask].max()) if bool(mask.any()) else 0.0,
        "off_policy/clipped_frac" if mode == "tis" else "off_policy/masked_frac": over_frac,
        "off_policy/log_ratio_abs_mean": float(log_ratio.abs().sum()) / n,
    }
    return weights, metrics
