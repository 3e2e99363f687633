"""The actor objective: policy loss + KL term - entropy bonus, aggregated one way for all three.

Also :func:`apply_kl_reward_penalty`, the alternative placement of the KL term (``kl.mode="reward"``):
subtracted from the token rewards before the advantages are computed.
"""

from __future__ import annotations

import torch

from nemo_azr.algorithms.advantages import rewards_at_last_token
from nemo_azr.algorithms.aggregation import aggregate_loss, masked_mean
from nemo_azr.algorithms.kl import check_kl_mode, kl_penalty
from nemo_azr.algorithms.off_policy import rollout_is_weights
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.batch import Batch
from nemo_azr.errors import BatchContractError
from nemo_azr.registry import POLICY_LOSSES


def policy_objective(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: int | None = None,
    norm_length: int | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    kl_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss and float metrics from ``logprobs/old_logprobs/advantages/loss_mask[B, T]``.

    ``loss = agg(pg) + kl.coef * agg(kl) - entropy_coef * agg(entropy)`` where ``agg`` is
    :func:`aggregate_loss` with ``cfg.loss_agg_mode`` and the given global normalisers; the KL term is
    only used with ``kl.mode == "loss"``, each row's penalty times ``kl_weight[B]`` where given
    (``contracts.fields.KL_WEIGHT``). ``actor/pg_loss``, ``actor/kl_loss`` and ``actor/entropy`` are
    the aggregated terms (so they add up over micro-batches like the loss); the ratio metrics
    (``actor/clip_frac`` ...) are means over this call's trained tokens.

    ``rollout_logprobs`` (with ``cfg.off_policy_correction`` tis / mis): the advantages are first
    weighted by the importance weights ``pi_old / pi_rollout`` (algorithms/off_policy.py), computed
    here from ``old_logprobs``. The trainer uses this when ``old_logprobs`` are the update's own
    (detached), so the correction needs no separate log-prob pass; the ``off_policy/*`` metrics
    are then this call's.
    """
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise BatchContractError(
                f"policy_objective: {name} is {list(t.shape)}, logprobs is {list(shape)}"
            )
    check_kl_mode(cfg.kl.mode)
    loss_fn = POLICY_LOSSES.get(cfg.loss)
    is_metrics: dict[str, float] = {}
    if rollout_logprobs is not None:
        if rollout_logprobs.shape != shape:
            raise BatchContractError(
                f"policy_objective: rollout_logprobs is {list(rollout_logprobs.shape)}, logprobs is {list(shape)}"
            )
        weights, is_metrics = rollout_is_weights(
            old_logprobs,
            rollout_logprobs.to(old_logprobs.device),
            loss_mask,
            mode=cfg.off_policy_correction,
            cap=cfg.is_cap,
            level=cfg.is_level,
        )
        advantages = advantages * weights.to(advantages.dtype)

    def agg(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(
            values,
            loss_mask,
            cfg.loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length or cfg.norm_length or None,  # 0 means "not set"
            eta=cfg.loss_eta,
        )

    loss_mat, loss_metrics = loss_fn(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, loss_mask=loss_mask, cfg=cfg
    )
    pg_loss = agg(loss_mat)
    loss = pg_loss
    metrics = {"actor/pg_loss": float(pg_loss.detach()), **is_metrics}
    metrics.update({f"actor/{k}": float(v) for k, v in loss_metrics.items()})

    if cfg.kl.coef > 0 and cfg.kl.mode == "loss":
        if ref_logprobs is None:
            raise BatchContractError(
                "policy_objective: algorithm.kl.coef > 0 with kl.mode='loss' needs 'ref_logprobs' [B,T]"
            )
        kl_loss = agg(weighted_by_row(kl_penalty(logprobs, ref_logprobs, cfg.kl.estimator), kl_weight))
        loss = loss + cfg.kl.coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())

    if entropy is not None:
        entropy_term = agg(entropy)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * entropy_term
        metrics["actor/entropy"] = float(entropy_term.detach())
    return loss, metrics


def weighted_by_row(values: torch.Tensor, row_weight: torch.Tensor | None) -> torch.Tensor:
    """``values[B, T] * row_weight[B, None]`` (``values`` itself when there are no weights)."""
    if row_weight is None:
        return values
    if row_weight.dim() != 1 or row_weight.shape[0] != values.shape[0]:
        raise BatchContractError(
            f"{F.KL_WEIGHT!r} must be [B] = [{values.shape[0]}], got {list(row_weight.shape)}"
        )
    return values * row_weight.to(device=values.device, dtype=values.dtype)[:, None]


def apply_kl_reward_penalty(batch: Batch, cfg: AlgorithmConfig) -> dict[str, float]:
    """``token_rewards[B, T] -= kl.coef * kl(old_logprobs, ref_logprobs) * loss_mask`` (``kl.mode="reward"``),
    each row's penalty times its ``kl_weight`` where the batch has them.

    The base token rewards are the existing ``token_rewards``, else ``rewards[B]`` at each row's last
    trained token. Does nothing (returns ``{}``) unless ``kl.mode == "reward"`` and ``kl.coef > 0``, so
    the trainer may call it unconditionally.
    """
    check_kl_mode(cfg.kl.mode)
    if cfg.kl.mode != "reward" or cfg.kl.coef <= 0:
        return {}
    missing = [k for k in (F.OLD_LOGPROBS, F.REF_LOGPROBS, F.LOSS_MASK) if k not in batch.tensors]
    if F.TOKEN_REWARDS not in batch.tensors and F.REWARDS not in batch.tensors:
        missing.append(F.REWARDS)
    if missing:
        raise BatchContractError(f"KL reward penalty (kl.mode='reward'): batch lacks {missing}")
    mask = batch.tensors[F.LOSS_MASK]
    with torch.no_grad():
        kl = kl_penalty(batch.tensors[F.OLD_LOGPROBS], batch.tensors[F.REF_LOGPROBS], cfg.kl.estimator)
        kl = weighted_by_row(kl, batch.tensors.get(F.KL_WEIGHT))
        if F.TOKEN_REWARDS in batch.tensors:
            base = batch.tensors[F.TOKEN_REWARDS]
        else:
            base = rewards_at_last_token(batch.tensors[F.REWARDS], mask)
        # At least float32: bf16 log-probs must not round the rewards.
        dtype = torch.promote_types(torch.promote_types(base.dtype, kl.dtype), torch.float32)
        kl = kl.to(dtype) * mask.to(dtype)
        penalty = cfg.kl.coef * kl
        batch[F.TOKEN_REWARDS] = base.to(dtype) - penalty
    return {
        "kl/reward_penalty_mean": float(masked_mean(penalty, mask)),
        "kl/reward_kl_mean": float(masked_mean(kl, mask)),
    }
