"""Direct preference losses (seed 004, class 5): DPO, IPO and KTO on sequence log-probabilities.

Each is registered in :data:`nemo_azr.registry.PREFERENCE_LOSSES` and reads the log-probability of a
whole response, ``log pi(y|x)`` summed over its tokens (:func:`sequence_logps`), under the policy
and under the frozen reference, as the papers write them. They return the mean loss over pairs
(DPO, IPO) or over examples (KTO), as the papers average, and detached metrics:

* ``rewards_chosen`` / ``rewards_rejected``: mean implicit reward ``beta * (log pi - log ref)`` of
  the preferred / dispreferred responses (KTO: desirable / undesirable);
* ``reward_margin``: mean chosen minus rejected reward; ``reward_accuracy``: fraction of pairs whose
  chosen reward is the larger (KTO: of examples on the right side of the reference point);
* KTO also ``kl_reference``: the batch estimate of KL(pi || ref) its value function is centred on.

:func:`chosen_nll` is the term RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization",
eq. 2; TRL's ``rpo_alpha``) adds to DPO: the chosen response's negative log-likelihood per token,
``-log pi(y_w|x) / |y_w|``, averaged over pairs. DPO alone may widen the margin by lowering both
responses; this keeps the chosen one likely (``preference.nll_weight``).

Formulas, with ``h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))``:

* DPO (Rafailov et al. 2023, eq. 7): ``-log sigmoid(beta * h)``; with label smoothing ``eps``
  (conservative DPO, Mitchell 2023) ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``;
* IPO (Azar et al. 2023, eq. 17): ``(h - 1 / (2 * beta))^2`` (``beta`` is the paper's tau);
* KTO (Ethayarajh et al. 2024, eq. 8): with ``r = log pi(y) - log ref(y)`` and ``z0`` the
  mismatched-pair estimate of KL(pi || ref), clamped at 0 and not differentiated:
  ``lambda_D (1 - sigmoid(beta (r - z0)))`` for a desirable response and
  ``lambda_U (1 - sigmoid(beta (z0 - r)))`` for an undesirable one.

Written here rather than taken from TRL: TRL computes these inside its trainers on its own batch
layout, and the four-stage core needs them as functions of tensors it already holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nemo_azr.errors import ConfigError
from nemo_azr.registry import PREFERENCE_LOSSES

__all__ = ["chosen_nll", "dpo_loss", "ipo_loss", "kto_loss", "sequence_logps"]

Metrics = dict[str, torch.Tensor]


#: Losses over a pair's two rows (one loss term per pair); KTO scores single examples.
PAIRED_LOSSES = ("dpo", "ipo")


def sequence_logps(token_logps: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``log pi(y|x)`` per row: the sum of the response tokens' log-probs (``loss_mask`` marks them)."""
    return (token_logps * loss_mask.to(token_logps.dtype)).sum(-1)


def chosen_nll(chosen_logps: torch.Tensor, chosen_tokens: torch.Tensor) -> torch.Tensor:
    """RPO's term: the mean over pairs of ``-log pi(y_w|x) / |y_w|`` (``chosen_tokens``: each chosen
    response's token count)."""
    _check_pairs(logps=chosen_logps, tokens=chosen_tokens)
    return -(chosen_logps / chosen_tokens.to(chosen_logps.dtype).clamp(min=1)).mean()


def _check_pairs(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 1:
        raise ValueError(f"preference loss: one value per pair in each input, got shapes {shapes}")


def _check_beta(beta: float) -> None:
    if not beta > 0:
        raise ConfigError(f"preference beta must be > 0, got {beta}")


def _pair_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> Metrics:
    with torch.no_grad():
        return {
            "rewards_chosen": chosen_rewards.mean(),
            "rewards_rejected": rejected_rewards.mean(),
            "reward_margin": (chosen_rewards - rejected_rewards).mean(),
            "reward_accuracy": (chosen_rewards > rejected_rewards).float().mean(),
        }


def _pair_log_ratios(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paired losses' checked inputs as policy-over-reference log-ratios (chosen, rejected)."""
    _check_pairs(c=chosen, r=rejected, rc=ref_chosen, rr=ref_rejected)
    _check_beta(beta)
    return chosen - ref_chosen, rejected - ref_rejected


@PREFERENCE_LOSSES.register("dpo")
def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """DPO over pairs ``(y_w, y_l)``: all four inputs hold one sequence log-prob per pair."""
    if not 0.0 <= label_smoothing < 0.5:
        raise ConfigError(f"DPO label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen, rejected = _pair_log_ratios(
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    logits = beta * (chosen - rejected)
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return losses.mean(), _pair_metrics(beta * chosen.detach(), beta * rejected.detach())


@PREFERENCE_LOSSES.register("ipo")
def ipo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """IPO over pairs: the squared distance of the log-ratio margin from ``1 / (2 beta)``."""
    if label_smoothing:
        raise ConfigError("label_smoothing is DPO's; IPO's target margin 1/(2 beta) already regularises")
    chosen, rejected = _pair_log_ratios(
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    losses = (chosen - rejected - 1.0 / (2.0 * beta)) ** 2
    return losses.mean(), _pair_metrics(beta * chosen.detach(), beta * rejected.detach())


@PREFERENCE_LOSSES.register("kto")
def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl_logps: torch.Tensor,
    ref_kl_logps: torch.Tensor,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, Metrics]:
    """KTO over unpaired examples: ``desirable`` (bool) labels each response; ``kl_logps`` /
    ``ref_kl_logps`` are policy / reference log-probs of mismatched (prompt, other response) pairs,
    whose mean log-ratio estimates the reference point ``z0``."""
    _check_pairs(logps=logps, ref=ref_logps, label=desirable)
    _check_beta(beta)
    if not (desirable_weight > 0 and undesirable_weight > 0):
        raise ConfigError(
            f"KTO desirable/undesirable weights must be > 0, got {desirable_weight}/{undesirable_weight}"
        )
    if kl_logps.shape != ref_kl_logps.shape or kl_logps.numel() == 0:
        raise ValueError("KTO needs policy and reference log-probs of at least one mismatched pair, alike")
    desirable = desirable.bool()
    z0 = (kl_logps - ref_kl_logps).mean().clamp(min=0).detach()
    ratio = logps - ref_logps
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (ratio - z0))),
        undesirable_weight * (1 - torch.sigmoid(beta * (z0 - ratio))),
    )
    with torch.no_grad():
        rewards = beta * ratio.detach()
        right_side = torch.where(desirable, ratio > z0, ratio < z0)
        metrics: Metrics = {
            "kl_reference": z0,
            "reward_accuracy": right_side.float().mean(),
        }
        if desirable.any():
            metrics["rewards_chosen"] = rewards[desirable].mean()
        if (~desirable).any():
            metrics["rewards_rejected"] = rewards[~desirable].mean()
        if desirable.any() and (~desirable).any():
            metrics["reward_margin"] = metrics["rewards_chosen"] - metrics["rewards_rejected"]
    return losses.mean(), metrics
