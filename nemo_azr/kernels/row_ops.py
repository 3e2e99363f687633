"""Row operations shared by every log-prob driver: streaming statistics, their combine, and d logits.

A driver (:mod:`nemo_azr.kernels.chunked`, :mod:`nemo_azr.kernels.policy_loss`) walks the rows of a
``[N, V_local]`` logits block (given, or produced chunk by chunk from hidden states) and needs just
two things per row block, provided by a *row-ops backend*:

``stats(z, t_local, inv_temp, need_w, inplace) -> (RowPartials, in_scale, in_offset)``
    For ``u = z * inv_temp`` (the tempered logits of this vocab shard) the partial statistics
    ``m = max_v u``, ``s = sum_v exp(u - m)``, ``w = sum_v exp(u - m) (u - m)`` (only with
    ``need_w``) and ``tgt = u[t_local]`` (0 where ``t_local`` is not in ``[0, V_local)``).
    With ``inplace`` the backend may overwrite ``z``; it returns ``in_scale`` and ``in_offset[c]``
    such that afterwards ``u = z * in_scale + in_offset`` (``in_offset`` None means 0).

``dlogits(z, t_local, in_scale, lse_rel, entropy, g_lp, g_ent, out_scale, out, onehot=True)``
    Writes ``out = out_scale * (g_lp (onehot(t) - p) - g_ent p (log p + H))`` with
    ``u = z * in_scale``, ``log p = u - lse_rel`` (``lse_rel`` taken relative to the same offset as
    ``u``) and ``H = entropy``; ``log p + H = u - E_p[u]``. ``out`` may be ``z`` itself. This is
    ``d(g_lp logp + g_ent H) / dz`` when ``out_scale`` is ``d u / d z``. With ``onehot=False`` the
    ``out_scale g_lp onehot(t)`` term is left out: the fused-linear drivers add it to the GEMM
    results as ``g W[t]`` / ``g h`` instead, which keeps one large term out of the long sums over the
    vocabulary (a long fp32 reduction then only adds small terms: ~10x more accurate hidden
    gradients for short token chunks).

:func:`combine` turns the partials of one or several vocab shards into log-sum-exp, log-prob and
entropy; with a process group it all-reduces them (one MAX, one SUM of a stacked tensor).

:class:`TorchRowOps` is the pure-PyTorch backend (also the reference for the Triton one,
:mod:`nemo_azr.kernels.triton_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["RowPartials", "TorchRowOps", "combine", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs (so that gradcheck works), float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class RowPartials:
    """Per-row statistics of one vocab shard, all ``[c]`` in the compute dtype (see module doc)."""

    m: torch.Tensor
    s: torch.Tensor
    w: torch.Tensor | None
    tgt: torch.Tensor

    @staticmethod
    def cat(parts: list[RowPartials]) -> RowPartials:
        if len(parts) == 1:
            return parts[0]
        w = None if parts[0].w is None else torch.cat([p.w for p in parts])
        return RowPartials(
            m=torch.cat([p.m for p in parts]),
            s=torch.cat([p.s for p in parts]),
            w=w,
            tgt=torch.cat([p.tgt for p in parts]),
        )


@dataclass
class RowStats:
    """Combined (whole-vocabulary) statistics ``[N]``: ``u = z / T``, ``p = softmax(u)``."""

    m: torch.Tensor  # max_v u_v (over the whole vocabulary)
    log_s: torch.Tensor  # log sum_v exp(u_v - m)
    lse: torch.Tensor  # m + log_s = log sum_v exp(u_v)
    logp: torch.Tensor  # u_target - lse
    entropy: torch.Tensor | None  # H = lse - E_p[u]

    def lse_rel(self, offset: torch.Tensor | None) -> torch.Tensor:
        """``lse - offset`` without the rounding of ``lse`` (``offset`` None means 0)."""
        return self.lse if offset is None else (self.m - offset) + self.log_s


def combine(part: RowPartials, group: dist.ProcessGroup | None = None) -> RowStats:
    """Log-sum-exp, target log-prob and entropy from per-shard partials.

    With ``group`` every rank holds the partials of its vocab shard for the same rows; the global
    max is all-reduced first, then ``s * exp(m - M)``, the rescaled ``w`` and the target logit
    (non-zero on one rank only) are summed in one all-reduce.
    """
    m, s, w, tgt = part.m, part.s, part.w, part.tgt
    if group is not None:
        big_m = m.contiguous().clone()  # gloo misbehaves on non-contiguous tensors
        dist.all_reduce(big_m, op=dist.ReduceOp.MAX, group=group)
        # A shard whose logits are all -inf has m = -inf and s = 0: it contributes nothing.
        finite = torch.isfinite(m)
        shift = torch.where(finite, m - big_m, torch.zeros_like(m))
        scale = torch.where(finite, torch.exp(shift), torch.zeros_like(m))
        rows = [s * scale]
        if w is not None:
            # sum exp(u - M)(u - M) = exp(m - M) (w + s (m - M))
            rows.append((w + s * shift) * scale)
        rows.append(tgt)
        stacked = torch.stack(rows).contiguous()
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM, group=group)
        m, s, tgt = big_m, stacked[0], stacked[-1]
        w = stacked[1] if w is not None else None
    log_s = torch.log(s)
    lse = m + log_s
    entropy = None if w is None else log_s - w / s
    return RowStats(m=m, log_s=log_s, lse=lse, logp=tgt - lse, entropy=entropy)


def local_targets(targets: torch.Tensor, ignored: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """Targets relative to the shard start as int64; ignored rows get -1 (matches no column)."""
    t = targets.long() - vocab_start
    return t.masked_fill(ignored, -1)


class TorchRowOps:
    """Row ops in plain PyTorch: a few passes over each ``[c, V]`` chunk, at most 2 chunk buffers."""

    name = "torch"
    #: Process rows ``chunk_size`` at a time even when the logits already exist (bounds temporaries).
    chunk_rows = True

    @staticmethod
    def stats(
        z: torch.Tensor, t_local: torch.Tensor, inv_temp: float, need_w: bool, inplace: bool
    ) -> tuple[RowPartials, float, torch.Tensor | None]:
        cdt = compute_dtype(z.dtype)
        owned = inplace
        u = z
        if u.dtype != cdt:
            u, owned = u.to(cdt), True
        if inv_temp != 1.0:
            u = u.mul_(inv_temp) if owned else u * inv_temp
            owned = True
        m = u.amax(dim=1)
        tgt = _gather_local(u, t_local)
        d = u.sub_(m.unsqueeze(1)) if owned else u - m.unsqueeze(1)  # d = u - m, a buffer we own
        e = torch.exp(d)
        s = e.sum(dim=1)
        # sum_v e_v d_v in e's buffer (e is not needed any more): no third [c, V] buffer. A batched
        # dot product (bmm) would avoid it too but sums 32k+ terms with ~1e-5 relative error.
        w = e.mul_(d).sum(dim=1) if need_w else None
        del e
        if inplace and d.data_ptr() == z.data_ptr():
            return RowPartials(m=m, s=s, w=w, tgt=tgt), 1.0, m
        return RowPartials(m=m, s=s, w=w, tgt=tgt), inv_temp, None

    @staticmethod
    def dlogits(
        z: torch.Tensor,
        t_local: torch.Tensor,
        in_scale: float,
        lse_rel: torch.Tensor,
        entropy: torch.Tensor | None,
        g_lp: torch.Tensor,
        g_ent: torch.Tensor | None,
        out_scale: float,
        out: torch.Tensor,
        onehot: bool = True,
    ) -> None:
        cdt = compute_dtype(z.dtype)
        if out.dtype == cdt and out.is_contiguous():
            b = out if out.data_ptr() == z.data_ptr() else out.copy_(z)
        else:
            b = z.to(cdt, copy=True)
        if in_scale != 1.0:
            b.mul_(in_scale)
        b.sub_(lse_rel.unsqueeze(1))  # b = u - lse = log p
        g_lp_s = g_lp * out_scale
        if g_ent is None:
            b.exp_().mul_(-g_lp_s.unsqueeze(1))
        else:
            # -p (g_lp + g_ent (log p + H))
            factor = b.add(entropy.unsqueeze(1))
            factor.mul_((g_ent * out_scale).unsqueeze(1)).add_(g_lp_s.unsqueeze(1))
            b.exp_().mul_(factor).neg_()
            del factor
        if onehot:
            _scatter_add_local_(b, t_local, g_lp_s)
        if b.data_ptr() != out.data_ptr():
            out.copy_(b)

    # --- single-pass fast path (used by the fused policy loss): one exp per logit instead of two ---
    @staticmethod
    def stats_keep_exp(
        z: torch.Tensor, t_local: torch.Tensor, inv_temp: float, need_w: bool
    ) -> tuple[RowPartials, torch.Tensor]:
        """``stats(z, ..., inplace=True)`` that also returns ``e = exp(u - m)``.

        With ``need_w`` (entropy) ``z`` then holds ``d = u - m`` and ``e`` is a second buffer; without
        it ``e`` is ``z``'s own buffer (one ``[c, V]`` buffer in all).
        """
        if inv_temp != 1.0:
            z.mul_(inv_temp)
        m = z.amax(dim=1)
        tgt = _gather_local(z, t_local)
        d = z.sub_(m.unsqueeze(1))
        w = None
        if need_w:
            e = torch.exp(d)
            w = _row_dot(e, d)
        else:
            e = d.exp_()
        s = e.sum(dim=1)
        return RowPartials(m=m, s=s, w=w, tgt=tgt), e

    @staticmethod
    def dlogits_from_exp(
        e: torch.Tensor,
        d: torch.Tensor,
        lse_rel: torch.Tensor,
        entropy: torch.Tensor | None,
        g_lp: torch.Tensor,
        g_ent: torch.Tensor | None,
        out_scale: float,
    ) -> torch.Tensor:
        """``d logits`` without the target term, in ``e``'s buffer (``d`` may be overwritten).

        ``e = exp(d)``, ``d = u - m`` and ``lse_rel = lse - m`` (from :meth:`stats_keep_exp`), so
        ``p = e exp(-lse_rel)`` and ``log p = d - lse_rel``: no second ``exp`` over the chunk.
        ``d`` is only read with ``g_ent`` (then it must not be ``e``).
        """
        scale = torch.exp(-lse_rel) * out_scale
        if g_ent is None:
            return e.mul_((-g_lp * scale).unsqueeze(1))
        # -p (g_lp + g_ent (log p + H)); the factor is built in d's buffer
        factor = d.add_((entropy - lse_rel).unsqueeze(1)).mul_(g_ent.unsqueeze(1)).add_(g_lp.unsqueeze(1))
        return e.mul_(factor).mul_((-scale).unsqueeze(1))


def shard_index(t_local: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inside, idx)``: whether each target is in this ``width``-column shard, and a safe column index."""
    inside = (t_local >= 0) & (t_local < width)
    return inside, t_local.clamp(0, width - 1)


#: Column block of :func:`_row_dot` (bounds its temporary to ``rows x _DOT_BLOCK``).
_DOT_BLOCK = 8192


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(1)`` with a ``[rows, _DOT_BLOCK]`` temporary instead of a full-size one."""
    out = torch.zeros(a.shape[0], dtype=a.dtype, device=a.device)
    for c in range(0, a.shape[1], _DOT_BLOCK):
        out += (a[:, c : c + _DOT_BLOCK] * b[:, c : c + _DOT_BLOCK]).sum(1)
    return out


def _gather_local(u: torch.Tensor, t_local: torch.Tensor) -> torch.Tensor:
    inside, idx = shard_index(t_local, u.shape[1])
    picked = u.gather(1, idx.unsqueeze(1)).squeeze(1)
    return torch.where(inside, picked, torch.zeros((), dtype=u.dtype, device=u.device))


def _scatter_add_local_(b: torch.Tensor, t_local: torch.Tensor, values: torch.Tensor) -> None:
    inside, idx = shard_index(t_local, b.shape[1])
    b.scatter_add_(1, idx.unsqueeze(1), (values * inside).to(b.dtype).unsqueeze(1))
