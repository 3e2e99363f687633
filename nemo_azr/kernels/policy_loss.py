"""The actor objective fused with the LM head: PPO loss, k3 KL and entropy bonus without ``[N, V]`` logits.

:func:`fused_linear_policy_loss` returns the same scalar loss and metrics as
:func:`nemo_azr.algorithms.objective.policy_objective` applied to the log-probs of
``hidden @ weight.T / T``, but never materialises the logits of more than one token chunk:

* **Single pass** (losses whose per-token value depends on that token's log-prob only:
  ``ppo_clip`` with or without dual clip, ``cispo``, plus the k1/k2/k3 KL term and the entropy bonus): for each
  token chunk the logits are produced (one GEMM), the row ops give ``logp`` and ``H`` (all-reduced
  across vocab shards), the per-token loss derivatives ``dL/dlogp`` and ``dL/dH`` are computed from
  the core's own formulas (autograd through :func:`~nemo_azr.algorithms.losses.ppo_clip` and
  :func:`~nemo_azr.algorithms.kl.kl_penalty` on the ``[chunk]`` vectors, weighted by the aggregation
  weights of :func:`~nemo_azr.algorithms.aggregation.aggregate_loss`), the row ops overwrite the
  chunk's logits with ``d loss / d logits``, and two GEMMs give that chunk's hidden gradient and its
  contribution to the weight gradient. Three GEMMs in all (the same as the naive path), no
  recomputation; the gradients are kept until ``backward`` scales them by the upstream gradient
  (the way Liger's fused linear cross entropy works).
* **Two passes** (any other registered loss, e.g. ``gspo`` whose ratio is a sequence mean): the
  differentiable chunked log-probs (and entropy) are fed to ``policy_objective`` itself; the
  backward recomputes each chunk's logits.

The loss value and metrics always come from ``policy_objective`` evaluated on the kernel's log-probs,
so they are the reference's by construction; the gradient of the single pass equals the
reference's up to float rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from nemo_azr.algorithms.aggregation import aggregate_loss
from nemo_azr.algorithms.kl import check_kl_mode, kl_penalty
from nemo_azr.algorithms.losses import cispo, ppo_clip
from nemo_azr.algorithms.objective import policy_objective
from nemo_azr.algorithms.off_policy import is_weights, rollout_is_weights
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.errors import BatchContractError
from nemo_azr.kernels.backend import get_row_ops, resolve_backend
from nemo_azr.kernels.chunked import (
    apply_dlogits,
    chunk_logits,
    linear_token_logprobs_chunked,
)
from nemo_azr.kernels.row_ops import combine, compute_dtype, local_targets
from nemo_azr.kernels.vocab_parallel import default_vocab_start
from nemo_azr.registry import POLICY_LOSSES

__all__ = ["TOKEN_LOCAL_LOSSES", "aggregation_weights", "fused_linear_policy_loss"]

#: Policy losses whose token ``t`` depends on ``logprobs[t]`` only: they run in a single pass.
TOKEN_LOCAL_LOSSES = (ppo_clip, cispo)


def aggregation_weights(
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    *,
    num_tokens: float | None = None,
    num_seqs: int | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """``w[B, T]`` with ``aggregate_loss(x, loss_mask, ...) == (w * x).sum()`` for every ``x``.

    Every aggregation mode is linear in the per-token values, so ``w`` is the gradient of
    :func:`aggregate_loss` itself: the core's normalisers (global ``num_tokens``/``num_seqs``,
    ``eta``, ``norm_length``, empty rows, zero denominators) are used as they are, not re-derived.
    """
    x = torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device, requires_grad=True)
    with torch.enable_grad():
        y = aggregate_loss(
            x,
            loss_mask,
            cfg.loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length or cfg.norm_length or None,  # as policy_objective: 0 means "not set"
            eta=cfg.loss_eta,
        )
        (w,) = torch.autograd.grad(y, x)
    return w


@dataclass
class _TokenTerms:
    """What the single pass needs per selected token ``[N]`` to differentiate the objective."""

    cfg: AlgorithmConfig
    loss_fn: Any
    agg_w: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    old: torch.Tensor | None  # None: on-policy, the current log-probs (detached)
    ref: torch.Tensor | None  # None: no KL term
    need_entropy: bool
    rollout: torch.Tensor | None = None  # with old=None: token-level IS weights pi_old / pi_rollout
    kl_w: torch.Tensor | None = None  # each selected token's row weight of the KL term (None: 1)

    def d_logprobs(self, lp: torch.Tensor, s: int, e: int) -> torch.Tensor:
        """``dL/dlogp[s:e]`` by autograd through the core's loss and KL formulas on the chunk."""
        with torch.enable_grad():
            x = lp.detach().requires_grad_(True)
            old = x.detach() if self.old is None else self.old[s:e]
            advantages = self.advantages[s:e]
            if self.rollout is not None:  # token-level weights: chunk-local, like the loss
                advantages = advantages * is_weights(
                    old,
                    self.rollout[s:e],
                    self.mask[s:e],
                    mode=self.cfg.off_policy_correction,
                    cap=self.cfg.is_cap,
                    level="token",
                )
            loss_mat, _ = self.loss_fn(
                logprobs=x,
                old_logprobs=old,
                advantages=advantages,
                loss_mask=self.mask[s:e],
                cfg=self.cfg,
            )
            w = self.agg_w[s:e]
            total = (loss_mat * w).sum()
            if self.ref is not None:
                kl = kl_penalty(x, self.ref[s:e], self.cfg.kl.estimator)
                if self.kl_w is not None:
                    kl = kl * self.kl_w[s:e]
                total = total + self.cfg.kl.coef * (kl * w).sum()
            (g,) = torch.autograd.grad(total, x)
        return g

    def d_entropy(self, s: int, e: int) -> torch.Tensor | None:
        if self.need_entropy and self.cfg.entropy_coef > 0:
            return -self.cfg.entropy_coef * self.agg_w[s:e]
        return None


class _FusedLinearPolicyLoss(torch.autograd.Function):
    """Outputs ``(anchor, logp, entropy)``: ``anchor`` is a 0 whose gradient carries the loss's."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        targets,
        terms,
        ops,
        temperature,
        chunk_size,
        ignore_index,
        group,
        vocab_start,
        reduce_h,
    ):
        n = hidden.shape[0]
        cdt = compute_dtype(hidden.dtype)
        inv_temp = 1.0 / temperature
        need_h, need_w = hidden.requires_grad, weight.requires_grad
        ignored = targets == ignore_index
        t_local = local_targets(targets, ignored, vocab_start)
        low_precision = weight.dtype != cdt
        logp = torch.zeros(n, dtype=cdt, device=hidden.device)
        entropy = torch.zeros(n if terms.need_entropy else 0, dtype=cdt, device=hidden.device)
        grad_hidden = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_h else None
        grad_w_acc = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            h_c, tl_c, ign_c = hidden[s:e], t_local[s:e], ignored[s:e]
            z = chunk_logits(h_c, weight, cdt)
            need_grad = need_h or need_w
            e_buf = None
            if need_grad and hasattr(ops, "stats_keep_exp"):
                # torch row ops: keep exp(u - m) of the stats pass for the gradient (one exp, not two)
                part, e_buf = ops.stats_keep_exp(z, tl_c, inv_temp, terms.need_entropy)
                in_scale, offset = 1.0, part.m
            else:
                part, in_scale, offset = ops.stats(z, tl_c, inv_temp, terms.need_entropy, inplace=True)
            st = combine(part, group)
            lp_c = st.logp.masked_fill(ign_c, 0.0)
            logp[s:e] = lp_c
            if terms.need_entropy:
                entropy[s:e] = st.entropy.masked_fill(ign_c, 0.0)
            if need_grad:
                g_lp = terms.d_logprobs(lp_c, s, e).to(cdt).masked_fill(ign_c, 0.0)
                g_ent = terms.d_entropy(s, e)
                if g_ent is not None:
                    g_ent = g_ent.to(cdt).masked_fill(ign_c, 0.0)
                ent_c = st.entropy if g_ent is not None else None
                lse_rel = st.lse_rel(offset)
                if e_buf is not None:
                    dz = ops.dlogits_from_exp(e_buf, z, lse_rel, ent_c, g_lp, g_ent, inv_temp)
                else:
                    ops.dlogits(z, tl_c, in_scale, lse_rel, ent_c, g_lp, g_ent, inv_temp, z, onehot=False)
                    dz = z
                apply_dlogits(dz, h_c, weight, grad_hidden, grad_w_acc, s, e, tl_c, g_lp * inv_temp)
                del dz
            del z, e_buf
        grad_weight = None
        if need_w:
            grad_weight = grad_w_acc.to(weight.dtype) if low_precision else grad_w_acc
        del grad_w_acc
        if need_h and group is not None and reduce_h:
            dist.all_reduce(grad_hidden, group=group)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.mark_non_differentiable(logp, entropy)
        anchor = torch.zeros((), dtype=torch.float32, device=hidden.device)
        return anchor, logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_anchor, _grad_logp, _grad_entropy):
        grad_hidden, grad_weight = ctx.saved_tensors
        if bool(grad_anchor != 1):  # the usual loss.backward() passes 1: no [V, H] copy then
            grad_hidden = None if grad_hidden is None else grad_hidden * grad_anchor.to(grad_hidden.dtype)
            grad_weight = None if grad_weight is None else grad_weight * grad_anchor.to(grad_weight.dtype)
        return (grad_hidden, grad_weight) + (None,) * 9


def _check_bt(name: str, t: torch.Tensor | None, shape: torch.Size) -> None:
    if t is not None and t.shape != shape:
        raise BatchContractError(
            f"fused_linear_policy_loss: {name} is {list(t.shape)}, targets is {list(shape)}"
        )


def _row_weights_at(
    row_weight: torch.Tensor | None, shape: torch.Size, sel: torch.Tensor
) -> torch.Tensor | None:
    """``row_weight[B]`` at each selected token of ``[B, T]`` (``[N]`` float32; None stays None)."""
    if row_weight is None:
        return None
    if row_weight.dim() != 1 or row_weight.shape[0] != shape[0]:
        raise BatchContractError(f"kl_weight must be [B] = [{shape[0]}], got {list(row_weight.shape)}")
    return row_weight.to(sel.device).float()[:, None].expand(shape)[sel]


def fused_linear_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: int | None = None,
    norm_length: int | None = None,
    temperature: float = 1.0,
    backend: str = "auto",
    chunk_size: int = 1024,
    compute_entropy: bool | None = None,
    ignore_index: int = -100,
    process_group: dist.ProcessGroup | None = None,
    vocab_start: int | None = None,
    reduce_hidden_grad: bool = True,
    kl_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``policy_objective`` on the log-probs of ``hidden[B, T, H] @ weight[V, H].T / T`` at ``targets[B, T]``.

    Row ``(b, t)`` of ``hidden`` predicts ``targets[b, t]`` (the caller shifts by one); only tokens
    with ``loss_mask > 0`` are computed, the others get log-prob 0 exactly as the policy's own
    ``token_logprobs`` gives them. ``advantages``, ``loss_mask``, ``old_logprobs`` (None: on-policy,
    the current log-probs detached) and ``ref_logprobs`` are ``[B, T]``; ``num_tokens``,
    ``num_seqs``, ``norm_length``, ``rollout_logprobs`` and ``cfg`` mean what they mean for
    ``policy_objective`` (the single pass applies the importance weights per token chunk, so only
    ``cfg.is_level="token"`` there); ``kl_weight[B]`` scales each row's KL term, as there.
    ``compute_entropy`` (default: ``cfg.entropy_coef > 0``) adds the entropy term and the
    ``actor/entropy`` metric. With ``process_group``, ``weight`` is this rank's vocab shard starting
    at ``vocab_start`` (default ``rank * V_local``). Returns ``(loss, metrics)``; gradients reach
    ``hidden`` and ``weight``.
    """
    shape = targets.shape
    if hidden.dim() != targets.dim() + 1 or hidden.shape[:-1] != shape:
        raise BatchContractError(
            f"fused_linear_policy_loss: hidden is {list(hidden.shape)}, expected {list(shape)} + [H]"
        )
    for name, t in (("advantages", advantages), ("loss_mask", loss_mask)):
        _check_bt(name, t, shape)
    _check_bt("old_logprobs", old_logprobs, shape)
    _check_bt("ref_logprobs", ref_logprobs, shape)
    _check_bt("rollout_logprobs", rollout_logprobs, shape)
    check_kl_mode(cfg.kl.mode)
    loss_fn = POLICY_LOSSES.get(cfg.loss)
    if (
        rollout_logprobs is not None
        and old_logprobs is None
        and loss_fn in TOKEN_LOCAL_LOSSES
        and cfg.is_level != "token"
    ):
        raise BatchContractError(
            "fused_linear_policy_loss: sequence-level importance weights need the whole row's log-probs "
            "before any token's gradient; pass old_logprobs weighted beforehand (the trainer does)"
        )
    use_kl = cfg.kl.coef > 0 and cfg.kl.mode == "loss"
    if use_kl and ref_logprobs is None:
        raise BatchContractError(
            "fused_linear_policy_loss: algorithm.kl.coef > 0 with kl.mode='loss' needs 'ref_logprobs' [B,T]"
        )
    need_entropy = cfg.entropy_coef > 0 if compute_entropy is None else bool(compute_entropy)
    ops = get_row_ops(resolve_backend(backend, hidden, weight))
    if vocab_start is None:
        vocab_start = default_vocab_start(weight.shape[0], process_group)
    device = hidden.device
    sel = loss_mask.to(device) > 0
    h_sel, t_sel = hidden[sel], targets.to(device)[sel]

    def to_dev(x):
        return None if x is None else x.to(device)

    advantages, loss_mask, old_logprobs, ref_logprobs, rollout_logprobs = map(
        to_dev, (advantages, loss_mask, old_logprobs, ref_logprobs, rollout_logprobs)
    )
    pre_metrics: dict[str, float] = {}
    if rollout_logprobs is not None and old_logprobs is not None:
        # Given old log-probs fix the weights before the pass: weight the advantages once, here.
        weights, pre_metrics = rollout_is_weights(
            old_logprobs, rollout_logprobs, loss_mask,
            mode=cfg.off_policy_correction, cap=cfg.is_cap, level=cfg.is_level,
        )  # fmt: skip
        advantages, rollout_logprobs = advantages * weights.to(advantages.dtype), None
    # Without old log-probs the weights come from the pass's own (detached) log-probs, chunk by chunk.
    rollout_in_kernel = None if rollout_logprobs is None else rollout_logprobs[sel].float()
    temperature, chunk_size, ignore_index = float(temperature), int(chunk_size), int(ignore_index)
    anchor = None
    if loss_fn in TOKEN_LOCAL_LOSSES:
        agg_w = aggregation_weights(
            loss_mask, cfg, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
        )
        terms = _TokenTerms(
            cfg=cfg,
            loss_fn=loss_fn,
            agg_w=agg_w[sel],
            advantages=advantages[sel].float(),
            mask=loss_mask[sel].float(),
            old=None if old_logprobs is None else old_logprobs[sel].float(),
            ref=ref_logprobs[sel].float() if use_kl else None,
            need_entropy=need_entropy,
            rollout=rollout_in_kernel,
            kl_w=_row_weights_at(kl_weight, shape, sel) if use_kl else None,
        )
        anchor, lp, ent = _FusedLinearPolicyLoss.apply(
            h_sel, weight, t_sel, terms, ops, temperature, chunk_size, ignore_index,
            process_group, int(vocab_start), reduce_hidden_grad,
        )  # fmt: skip
    else:
        out = linear_token_logprobs_chunked(
            h_sel,
            weight,
            t_sel,
            ops=ops,
            return_entropy=need_entropy,
            group=process_group,
            vocab_start=int(vocab_start),
            reduce_hidden_grad=reduce_hidden_grad,
            temperature=temperature,
            chunk_size=chunk_size,
            ignore_index=ignore_index,
        )
        lp, ent = out if need_entropy else (out, None)
    zeros = torch.zeros(shape, dtype=lp.dtype, device=device)
    logprobs = zeros.masked_scatter(sel, lp)
    entropy = zeros.masked_scatter(sel, ent) if need_entropy else None
    loss, metrics = policy_objective(
        logprobs=logprobs,
        old_logprobs=logprobs.detach() if old_logprobs is None else old_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
        cfg=cfg,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        rollout_logprobs=rollout_logprobs,
        kl_weight=kl_weight,
    )
    if anchor is not None:
        loss = loss.detach() + anchor
    return loss, {**metrics, **pre_metrics}
