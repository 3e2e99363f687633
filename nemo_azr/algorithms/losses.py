"""Per-token policy losses: ``fn(*, logprobs, old_logprobs, advantages, loss_mask, cfg) -> (loss_mat[B, T], metrics)``.

Each is registered in :data:`nemo_azr.registry.POLICY_LOSSES`. ``loss_mat`` is NOT masked or reduced
(see :mod:`nemo_azr.algorithms.aggregation`); ``metrics`` are detached scalars over trained tokens:

* ``clip_frac``: fraction of tokens where the clipped term is the larger one (``pg2 > pg1``; cispo:
  where the importance weight was clipped);
* ``dual_clip_frac`` (ppo_clip): fraction where the dual-clip bound is active;
* ``approx_kl``: mean k3 estimate of KL(pi_old || pi_theta) on the sampled tokens,
  ``exp(logp - old) - (logp - old) - 1`` (non-negative, low variance);
* ``ratio_mean``: mean importance ratio actually used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nemo_azr.algorithms.aggregation import masked_mean
from nemo_azr.algorithms.kl import kl_penalty
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.errors import ConfigError
from nemo_azr.registry import POLICY_LOSSES

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

#: Bound on log importance ratios before ``exp``: keeps one stale token from overflowing to inf.
LOG_RATIO_CLAMP = 20.0


def _check_clip_cfg(cfg: AlgorithmConfig, *, dual_clip: bool) -> None:
    if cfg.clip_ratio_low < 0 or cfg.clip_ratio_high < 0:
        raise ConfigError(
            f"algorithm.clip_ratio_low/high must be >= 0, got {cfg.clip_ratio_low}/{cfg.clip_ratio_high}"
        )
    if dual_clip and cfg.clip_ratio_c <= 1:
        raise ConfigError(f"algorithm.clip_ratio_c must be > 1 with dual_clip, got {cfg.clip_ratio_c}")


def _common_metrics(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ratio: torch.Tensor,
    clipped: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        # kl_penalty(old, new, k3) = exp(new - old) - (new - old) - 1: KL(old || new) for samples from old.
        approx_kl = kl_penalty(old_logprobs.detach(), logprobs.detach(), "k3")
        return {
            "clip_frac": masked_mean(clipped.to(ratio.dtype), mask),
            "approx_kl": masked_mean(approx_kl, mask),
            "ratio_mean": masked_mean(ratio.detach(), mask),
        }


@POLICY_LOSSES.register("ppo_clip", "ppo")
def ppo_clip(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token ``loss_mat[B, T]`` from ``logprobs/old_logprobs/advantages[B, T]``.

    ``max(-A r, -A clip(r, 1-low, 1+high))`` with ``r = exp(logp - old)``; with ``cfg.dual_clip`` the
    loss of negative-advantage tokens is further capped at ``-A * clip_ratio_c`` (verl's dual clip), so
    a huge ratio on a bad token cannot produce an unbounded update.
    """
    _check_clip_cfg(cfg, dual_clip=cfg.dual_clip)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    clipped = torch.maximum(pg1, pg2)
    if cfg.dual_clip:
        pg3 = -advantages * cfg.clip_ratio_c
        negative = advantages < 0
        loss_mat = torch.where(negative, torch.minimum(clipped, pg3), clipped)
        dual_active = negative & (clipped > pg3)
    else:
        loss_mat = clipped
        dual_active = torch.zeros_like(clipped, dtype=torch.bool)

    metrics = _common_metrics(logprobs, old_logprobs, ratio, pg2 > pg1, loss_mask)
    metrics["dual_clip_frac"] = masked_mean(dual_active.to(ratio.dtype), loss_mask).detach()
    return loss_mat, metrics


@POLICY_LOSSES.register("gspo")
def gspo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (sequence-level ratio, token form as in the paper / verl) ``loss_mat[B, T]``.

    ``s_i = exp(mean over trained tokens of (logp - old))``; the token ratio
    ``s_it = sg[s_i] * exp(logp - sg[logp])`` equals ``s_i`` in value, and its gradient is ``s_i``
    times the token's score, so with ``loss_agg_mode="seq-mean-token-mean"`` (recommended) the
    gradient is exactly that of the sequence objective ``max(-A s_i, -A clip(s_i, 1-low, 1+high))``.
    No dual clip. Advantages are expected constant within a sequence (outcome rewards).
    """
    _check_clip_cfg(cfg, dual_clip=False)
    mask = loss_mask.to(logprobs.dtype)
    seq_len = mask.sum(-1).clamp(min=1)
    seq_log_ratio = ((logprobs - old_logprobs) * mask).sum(-1) / seq_len
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_ratio = seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss_mat = torch.maximum(pg1, pg2)
    return loss_mat, _common_metrics(logprobs, old_logprobs, ratio, pg2 > pg1, loss_mask)


@POLICY_LOSSES.register("cispo")
def cispo(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1) ``loss_mat[B, T] = -sg(clip(r, 1-low, 1+high)) * A * logp``.

    The importance weight is clipped and detached, never the token: every token keeps its gradient
    ``A * sg(w) * dlogp`` (PPO's clip zeroes the gradient of tokens past the bound, which is what
    drops rare "reasoning" tokens after the first update). ``clip_ratio_low >= 1`` leaves the weight
    without a lower bound, the paper's setting (conf/algorithm/cispo.yaml). ``clip_frac`` is the
    fraction of tokens whose weight was clipped.
    """
    _check_clip_cfg(cfg, dual_clip=False)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    lower = max(0.0, 1.0 - cfg.clip_ratio_low)
    weight = ratio.clamp(lower, 1.0 + cfg.clip_ratio_high).detach()
    loss_mat = -advantages * weight * logprobs
    clipped = (ratio > 1.0 + cfg.clip_ratio_high) | (ratio < lower)
    return loss_mat, _common_metrics(logprobs, old_logprobs, ratio, clipped, loss_mask)
