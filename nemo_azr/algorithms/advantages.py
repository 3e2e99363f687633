"""Advantage estimators: ``fn(batch, cfg) -> (advantages[B, T], returns[B, T] | None)``.

Each estimator is registered in :data:`nemo_azr.registry.ADVANTAGE_ESTIMATORS` and carries three
attributes the trainer reads before calling it:

* ``required_keys``: batch tensors it needs beyond ``rewards`` / ``loss_mask``;
* ``required_meta``: per-row meta it needs (``group_id`` for the group baselines);
* ``needs_greedy_baseline``: whether the rollout must also produce a greedy sample per prompt;
* ``min_samples_per_prompt``: the least ``generation.n_samples`` it can work with (a baseline from
  the other samples of a prompt needs two); the preflight check reads it.

They make the registered function an ``contracts.algorithm.AdvantageEstimator``.

Advantages are float32 and exactly 0 wherever ``loss_mask`` is 0. Groups come only from the explicit
``batch.meta["group_id"]``, never from the row order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from nemo_azr.algorithms.grouping import (
    group_index,
    group_mean,
    group_range,
    group_size,
    group_std,
    group_sum,
)
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.batch import Batch
from nemo_azr.errors import BatchContractError
from nemo_azr.registry import ADVANTAGE_ESTIMATORS

EstimatorFn = Callable[[Batch, AlgorithmConfig], tuple[torch.Tensor, torch.Tensor | None]]

#: Output dtype of every estimator.
ADVANTAGE_DTYPE = torch.float32
#: Dtype for reward statistics: the inputs are [B] (or [B, T]) so float64 costs nothing, and it keeps
#: ``r - mean`` of equal rewards at exactly 0 more often before the 1/(std + eps) scaling.
STATS_DTYPE = torch.float64


def advantage_estimator(
    name: str,
    *aliases: str,
    required_keys: tuple[str, ...] = (),
    required_meta: tuple[str, ...] = (),
    needs_greedy_baseline: bool = False,
    min_samples_per_prompt: int = 1,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register an estimator and attach its requirements; the wrapper checks them on every call."""

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        @functools.wraps(fn)
        def wrapper(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
            _check_inputs(batch, name, required_keys, required_meta)
            return fn(batch, cfg)

        wrapper.required_keys = tuple(required_keys)  # type: ignore[attr-defined]
        wrapper.required_meta = tuple(required_meta)  # type: ignore[attr-defined]
        wrapper.needs_greedy_baseline = needs_greedy_baseline  # type: ignore[attr-defined]
        wrapper.min_samples_per_prompt = min_samples_per_prompt  # type: ignore[attr-defined]
        return ADVANTAGE_ESTIMATORS.register(name, *aliases)(wrapper)

    return decorator


def _check_inputs(
    batch: Batch, name: str, required_keys: tuple[str, ...], required_meta: tuple[str, ...]
) -> None:
    have = ", ".join(sorted(batch.keys())) or "nothing"
    if F.LOSS_MASK not in batch.tensors:
        raise BatchContractError(
            f"advantage estimator {name!r}: missing tensor 'loss_mask' [B,T]; batch has: {have}"
        )
    if F.REWARDS not in batch.tensors and F.TOKEN_REWARDS not in batch.tensors:
        raise BatchContractError(
            f"advantage estimator {name!r}: needs 'rewards' [B] or 'token_rewards' [B,T]; batch has: {have}"
        )
    for key in required_keys:
        if key not in batch.tensors:
            raise BatchContractError(
                f"advantage estimator {name!r}: missing tensor {key!r}; batch has: {have}"
            )
    for key in required_meta:
        if key not in batch.meta:
            raise BatchContractError(
                f"advantage estimator {name!r}: missing per-row meta {key!r}; batch has: {have}"
            )
    mask = batch.tensors[F.LOSS_MASK]
    if mask.dim() != 2:
        raise BatchContractError(
            f"advantage estimator {name!r}: 'loss_mask' must be [B,T], got {list(mask.shape)}"
        )
    if F.TOKEN_REWARDS in batch.tensors and batch.tensors[F.TOKEN_REWARDS].shape != mask.shape:
        raise BatchContractError(
            f"advantage estimator {name!r}: 'token_rewards' must be {list(mask.shape)} like 'loss_mask', "
            f"got {list(batch.tensors[F.TOKEN_REWARDS].shape)}"
        )
    for key in (F.REWARDS, F.BASELINE_REWARDS):
        t = batch.tensors.get(key)
        if t is not None and t.dim() != 1:
            raise BatchContractError(
                f"advantage estimator {name!r}: {key!r} must be [B], got {list(t.shape)}"
            )


# --- shared helpers --------------------------------------------------------------------------------


def sequence_rewards(batch: Batch) -> torch.Tensor:
    """One reward per row ``rewards[B]``: ``token_rewards.sum(-1)`` when present, else ``rewards``."""
    if F.TOKEN_REWARDS in batch.tensors:
        return batch.tensors[F.TOKEN_REWARDS].sum(-1)
    return batch.tensors[F.REWARDS]


def rewards_at_last_token(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``token_rewards[B, T]`` with ``rewards[B]`` at each row's last ``loss_mask`` position (rows with none: 0)."""
    mask = loss_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device)
    # -1 for rows without a trained token, so the one-hot below matches no column.
    last = torch.where(mask, positions, -1).amax(dim=-1)
    one_hot = positions.unsqueeze(0) == last.unsqueeze(1)
    return one_hot.to(rewards.dtype) * rewards.unsqueeze(1)


def _float_mask(batch: Batch) -> torch.Tensor:
    return batch.tensors[F.LOSS_MASK].bool().to(ADVANTAGE_DTYPE)


def _broadcast(row_advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``row_advantages[B]`` onto the trained tokens: ``advantages[B, T]``, 0 where mask is 0."""
    return row_advantages.to(ADVANTAGE_DTYPE).unsqueeze(1) * mask


def _groups(batch: Batch, device: torch.device) -> tuple[torch.Tensor, int]:
    index = group_index(batch.meta[F.GROUP_ID], device=device)
    return index, int(index.max()) + 1 if index.numel() else 0


# --- estimators ------------------------------------------------------------------------------------


@advantage_estimator("grpo", required_meta=(F.GROUP_ID,), min_samples_per_prompt=2)
def grpo(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GRPO: ``A_i = (r_i - mean_g) / (std_g + eps)`` (or ``r_i - mean_g``), broadcast to ``advantages[B, T]``.

    ``std_g`` is the population std (1/G). A group whose rewards are all equal (including a group of
    one row) gets exactly 0, so float rounding in ``r - mean`` is never scaled up by ``1/eps``.
    """
    mask = _float_mask(batch)
    rewards = sequence_rewards(batch).to(STATS_DTYPE)
    index, num_groups = _groups(batch, rewards.device)
    mean = group_mean(rewards, index, num_groups)
    deviation = rewards - mean[index]
    if cfg.norm_by_std:
        std = group_std(rewards, index, num_groups, mean=mean)
        deviation = deviation / (std[index] + cfg.eps)
    constant = group_range(rewards, index, num_groups)[index] == 0
    advantages = _broadcast(torch.where(constant, 0.0, deviation), mask)
    return advantages, advantages.clone()


#: Per-row meta TRR++ groups by (with ``role``); self-play writes it (selfplay/joint_batch.py).
TASK_TYPE_META = "task_type"


@advantage_estimator("trr_plus_plus", "trr++", required_meta=(TASK_TYPE_META, F.ROLE))
def trr_plus_plus(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Task-Relative REINFORCE++ (Absolute Zero): ``A_i = (r_i - mean_k) / (std_k + eps)`` where ``k``
    is the row's (task type, role) over the whole batch: one baseline per task type x role (AZR's six
    for deduction / abduction / induction x propose / solve), not per prompt. ``advantages[B, T]``;
    population std; a constant group gets exactly 0; ``norm_by_std=false`` only subtracts the mean.
    """
    keys = list(zip(batch.meta[TASK_TYPE_META], batch.meta[F.ROLE]))
    regrouped = Batch(batch.tensors, {**batch.meta, F.GROUP_ID: keys}, batch.info)
    return grpo(regrouped, cfg)


@advantage_estimator("rloo", required_meta=(F.GROUP_ID,), min_samples_per_prompt=2)
def rloo(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RLOO: ``A_i = r_i - (sum_g - r_i) / (G - 1)`` (leave-one-out mean), ``advantages[B, T]``; G = 1 -> 0."""
    mask = _float_mask(batch)
    rewards = sequence_rewards(batch).to(STATS_DTYPE)
    index, num_groups = _groups(batch, rewards.device)
    sizes = group_size(index, num_groups)[index]
    others = group_sum(rewards, index, num_groups)[index] - rewards
    # A lone row has no baseline: clamp avoids 0/0 and the where() sets its advantage to 0.
    baseline = others / (sizes - 1).clamp(min=1).to(STATS_DTYPE)
    row_advantages = torch.where(sizes > 1, rewards - baseline, 0.0)
    advantages = _broadcast(row_advantages, mask)
    return advantages, advantages.clone()


@advantage_estimator("reinforce_plus_plus", "reinforce++")
def reinforce_plus_plus(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """REINFORCE++: discounted token returns ``returns[B, T]``, whitened over the batch -> ``advantages[B, T]``.

    Token rewards are ``token_rewards`` if present, else ``rewards`` at each row's last trained token.
    ``returns[t] = r_t + gamma * returns[next trained position]``: positions with ``loss_mask`` 0
    (environment / tool tokens between turns, padding) pass the running return through unchanged,
    so they neither cut credit nor count as a discount step; their own reward entries are ignored
    and their ``returns`` are 0. Whitening uses the mean and population std of the returns over all
    trained tokens of the batch.
    """
    mask = batch.tensors[F.LOSS_MASK].bool()
    if F.TOKEN_REWARDS in batch.tensors:
        token_rewards = batch.tensors[F.TOKEN_REWARDS].to(STATS_DTYPE)
    else:
        token_rewards = rewards_at_last_token(batch.tensors[F.REWARDS].to(STATS_DTYPE), mask)

    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=STATS_DTYPE, device=token_rewards.device)
    # Right-to-left scan over columns (vectorised over rows); a closed form with gamma^-k overflows.
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t], token_rewards[:, t] + cfg.gamma * running, running)
        returns[:, t] = torch.where(mask[:, t], running, 0.0)

    fmask = mask.to(STATS_DTYPE)
    count = fmask.sum()
    if count == 0:
        zeros = torch.zeros_like(fmask, dtype=ADVANTAGE_DTYPE)
        return zeros, zeros.clone()
    mean = (returns * fmask).sum() / count
    centred = (returns - mean) * fmask
    std = (centred.square().sum() / count).sqrt()
    selected = returns[mask]
    if selected.max() == selected.min():  # constant returns: exact 0, not rounding / eps
        advantages = torch.zeros_like(fmask)
    else:
        advantages = centred / (std + cfg.eps)
    return advantages.to(ADVANTAGE_DTYPE), returns.to(ADVANTAGE_DTYPE)


@advantage_estimator("remax", required_keys=(F.BASELINE_REWARDS,), needs_greedy_baseline=True)
def remax(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ReMax: ``A_i = r_i - baseline_rewards_i`` (reward of a greedy rollout of the same prompt), ``advantages[B, T]``."""
    mask = _float_mask(batch)
    rewards = sequence_rewards(batch).to(STATS_DTYPE)
    baseline = batch.tensors[F.BASELINE_REWARDS].to(STATS_DTYPE)
    advantages = _broadcast(rewards - baseline, mask)
    return advantages, advantages.clone()


@advantage_estimator("gae", required_keys=(F.VALUES,))
def gae(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GAE (Schulman et al. 2016) from the critic's ``values[B, T]``: ``advantages[B, T]``, ``returns[B, T]``.

    ``values[:, t]`` is ``V`` of the state before token ``t`` (the critic's output at the position
    that predicts token ``t``, aligned like the log-probs). Token rewards are ``token_rewards`` if
    present, else ``rewards`` at each row's last trained token. Right to left over trained positions:
    ``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t + gamma * lambda * A_next``, where "next"
    is the next trained position of the row (0 after the last one: the episode ends). Positions with
    ``loss_mask`` 0 (padding, an environment's tokens between two turns) are not actions: they pass
    ``V_next`` and ``A_next`` through unchanged and get 0. ``returns = A + V`` (the critic's target)
    before whitening; with ``algorithm.whiten_advantages`` the advantages are then shifted and scaled
    to mean 0, std 1 over the trained tokens of the batch (of one role, under per-role estimators).
    """
    mask = batch.tensors[F.LOSS_MASK].bool()
    values = batch.tensors[F.VALUES].to(STATS_DTYPE)
    if values.shape != mask.shape:
        raise BatchContractError(
            f"advantage estimator 'gae': 'values' must be {list(mask.shape)} like 'loss_mask', "
            f"got {list(values.shape)}"
        )
    if F.TOKEN_REWARDS in batch.tensors:
        token_rewards = batch.tensors[F.TOKEN_REWARDS].to(STATS_DTYPE)
    else:
        token_rewards = rewards_at_last_token(batch.tensors[F.REWARDS].to(STATS_DTYPE), mask)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(values.shape[0], dtype=STATS_DTYPE, device=values.device)
    next_adv = torch.zeros_like(next_value)
    # Right-to-left scan over columns, vectorised over rows (each row's trained positions in order).
    for t in range(values.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + cfg.gamma * next_value - values[:, t]
        adv_t = delta + cfg.gamma * cfg.gae_lambda * next_adv
        here = mask[:, t]
        advantages[:, t] = torch.where(here, adv_t, 0.0)
        next_adv = torch.where(here, adv_t, next_adv)
        next_value = torch.where(here, values[:, t], next_value)
    fmask = mask.to(STATS_DTYPE)
    returns = (advantages + values) * fmask
    if cfg.whiten_advantages:
        advantages = masked_whiten(advantages, fmask, eps=cfg.eps)
    return advantages.to(ADVANTAGE_DTYPE), returns.to(ADVANTAGE_DTYPE)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the positions where ``mask[B, T]`` is 1 (population std);
    0 elsewhere. Fewer than two positions, or constant values, give exactly 0."""
    count = mask.sum()
    if count < 2:
        return torch.zeros_like(values)
    mean = (values * mask).sum() / count
    centred = (values - mean) * mask
    selected = values[mask.bool()]
    if selected.max() == selected.min():
        return torch.zeros_like(values)
    std = (centred.square().sum() / count).sqrt()
    return centred / (std + eps)
