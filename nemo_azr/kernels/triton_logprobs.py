"""Triton row kernels: streaming (online) log-sum-exp statistics and ``d logits``, one row per program.

Both kernels walk one row of a ``[rows, V_local]`` block in ``BLOCK_V`` column tiles, so a row of any
vocabulary size is processed with registers for one tile only:

* ``_stats_kernel`` keeps the running max ``m``, ``s = sum exp(u - m)`` and
  ``w = sum exp(u - m) (u - m)`` (entropy), rescaling them by ``exp(m_old - m_new)`` whenever a tile
  raises the max, and reads the target logit ``u[t]`` once after the row. Outputs are the
  per-row partials of :class:`nemo_azr.kernels.row_ops.RowPartials`; :func:`row_ops.combine` turns
  them into ``lse``, ``logp`` and ``H`` (and all-reduces them across vocab shards).
* ``_dlogits_kernel`` re-reads the row and writes ``d logits`` directly:
  ``out_scale * (g_lp (onehot(t) - p) - g_ent p (log p + H))`` (the gradient of
  ``g_lp logp + g_ent H``), in the output's dtype, in place when ``out`` is ``z``.

This module imports triton at import time; :mod:`nemo_azr.kernels` imports it lazily, only when the
``triton`` backend is selected. The kernels are decorated on first use, per mode: with
``TRITON_INTERPRET=1`` set at that moment they run in Triton's CPU interpreter (tests), otherwise
they are compiled for the GPU. The variable must also have been set when triton was first imported
(triton decorates its own ``tl.max``/``tl.sum`` helpers then); ``tests/conftest.py`` does that on
machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_azr.kernels.row_ops import RowPartials, compute_dtype
from nemo_azr.kernels.triton_env import interpret_enabled

__all__ = ["TritonRowOps", "interpret_enabled"]

#: Column tile and warps of the stats kernel on the GPU (one row per program). Two H200 sweeps of this
#: kernel at vocabularies 49k/128k/152k, tiles 2048-8192 x 4/8 warps in both (16384 and 16 warps in
#: the second: slower; benchmarks/results/kernels_gpu_lanes.md, kernels_gpu_final.md): 8192 x 4 had
#: the lowest mean time, level with 2048 x 4 at 49k and 4-6% ahead at 128k/152k, about the size of
#: the run-to-run spread.
#: Several programs per row, a register prefetch and per-lane sums gained nothing (decision 159).
GPU_BLOCK_V = 8192
GPU_NUM_WARPS = 4
#: The d-logits kernel's (reads the row, writes the gradient): 4096 x 8, within 2-11% of the fastest
#: of tiles 1024-8192 x 4/8 warps at each vocabulary in both sweeps (no tile fastest in both).
GPU_DLOGITS_BLOCK_V = 4096
GPU_DLOGITS_NUM_WARPS = 8
#: Column tile in the interpreter: every tile is one numpy call per op, so bigger is faster.
INTERPRET_BLOCK_V = 32768


def _stats_kernel(
    Z,
    stride_z,
    T,
    M,
    S,
    W,
    TGT,
    n_cols,
    inv_temp,
    NEED_W: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    z_ptr = Z + row * stride_z
    t = tl.load(T + row)
    # The running max m and the exponents in base 2 (u2 = u * inv_temp * log2 e): exp2 is the GPU's
    # native exponential, and the scale folds into one multiply (H200: 80-88% of the HBM roofline,
    # torch's copy 88%; with exp 71-80%, benchmarks/results/stats_kernel_variants.md).
    scale2 = inv_temp * 1.4426950408889634
    m = tl.full((), float("-inf"), ACC)
    s = tl.full((), 0.0, ACC)
    w = tl.full((), 0.0, ACC)
    for start in tl.range(0, n_cols, BLOCK_V, num_stages=1):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < n_cols
        u = tl.load(z_ptr + offs, mask=valid, other=float("-inf")).to(ACC) * scale2
        m_new = tl.maximum(m, tl.max(u, 0))
        # A tile (and everything before it) of -inf logits leaves m_new = -inf: use 0 as the base.
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - base)
        e = tl.exp2(u - base)
        if NEED_W:
            # re-base the running w: sum e_old (u - m_old) -> sum e_new (u - m_new), in natural
            # units (the base-2 differences times ln 2)
            shift = tl.where(s > 0, (m - base) * 0.6931471805599453, 0.0)
            d = tl.where(valid & (e > 0), (u - base) * 0.6931471805599453, 0.0)
            w = alpha * (w + s * shift) + tl.sum(e * d, 0)
        s = s * alpha + tl.sum(e, 0)
        m = m_new
    # the target's logit read once (not a compare-and-sum over every tile); 0 when t is not a column
    # of this shard (-1: an ignored row)
    has_t = (t >= 0) & (t < n_cols)
    tgt = tl.where(has_t, tl.load(z_ptr + t, mask=has_t, other=0.0).to(ACC) * inv_temp, 0.0)
    m = m * 0.6931471805599453  # back to natural units
    tl.store(M + row, m)
    tl.store(S + row, s)
    tl.store(W + row, w)
    tl.store(TGT + row, tgt)


def _dlogits_kernel(
    Z,
    stride_z,
    OUT,
    stride_out,
    T,
    LSE,
    ENT,
    GLP,
    GENT,
    n_cols,
    in_scale,
    out_scale,
    HAS_ENT: tl.constexpr,
    ONEHOT: tl.constexpr,
    RTNE_DROP: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    z_ptr = Z + row * stride_z
    o_ptr = OUT + row * stride_out
    t = tl.load(T + row)
    lse = tl.load(LSE + row).to(ACC)
    g_lp = tl.load(GLP + row).to(ACC) * out_scale
    if HAS_ENT:
        ent = tl.load(ENT + row).to(ACC)
        g_ent = tl.load(GENT + row).to(ACC) * out_scale
    for start in range(0, n_cols, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < n_cols
        u = tl.load(z_ptr + offs, mask=valid, other=0.0).to(ACC) * in_scale
        logp = u - lse
        p = tl.exp(logp)
        if HAS_ENT:
            dz = -p * (g_lp + g_ent * (logp + ent))
        else:
            dz = -p * g_lp
        if ONEHOT:
            dz = tl.where(offs == t, dz + g_lp, dz)
        if RTNE_DROP > 0:
            # Round the float32 bits to nearest even before the (then exact) downcast. Only in the
            # interpreter, whose fp32 -> bf16/fp16 cast truncates; the GPU cast already rounds so.
            bits = dz.to(tl.uint32, bitcast=True)
            bits = bits + ((bits >> RTNE_DROP) & 1) + ((1 << (RTNE_DROP - 1)) - 1)
            dz = ((bits >> RTNE_DROP) << RTNE_DROP).to(tl.float32, bitcast=True)
        tl.store(o_ptr + offs, dz.to(OUT.dtype.element_ty), mask=valid)


_KERNELS: dict[bool, tuple] = {}


def _kernels(interpret: bool):
    """(stats, dlogits) decorated for this mode; ``triton.jit`` reads TRITON_INTERPRET when called."""
    if interpret not in _KERNELS:
        if interpret and type(tl.max).__name__ != "InterpretedFunction":
            # triton's own tl.* helpers were decorated for the GPU when triton was imported
            raise RuntimeError(
                "TRITON_INTERPRET=1 must be set before triton is first imported (for the CPU "
                "interpreter); set it in the environment of the process, or use backend='torch'"
            )
        _KERNELS[interpret] = (triton.jit(_stats_kernel), triton.jit(_dlogits_kernel))
    return _KERNELS[interpret]


def _acc(dtype: torch.dtype):
    return tl.float64 if compute_dtype(dtype) == torch.float64 else tl.float32


def _launch_cfg(x: torch.Tensor, n_cols: int, *, dlogits: bool = False) -> tuple[bool, dict]:
    interpret = interpret_enabled()
    if not x.is_cuda and not interpret:
        raise RuntimeError(
            "the triton kernels got CPU tensors without TRITON_INTERPRET=1; use CUDA tensors or "
            "backend='torch'"
        )
    cap = INTERPRET_BLOCK_V if interpret else (GPU_DLOGITS_BLOCK_V if dlogits else GPU_BLOCK_V)
    block = min(cap, triton.next_power_of_2(max(n_cols, 16)))
    meta = {"BLOCK_V": block}
    if not interpret:
        meta["num_warps"] = GPU_DLOGITS_NUM_WARPS if dlogits else GPU_NUM_WARPS
    return interpret, meta


def _interpreter_rounding(out_dtype: torch.dtype, cdt: torch.dtype, interpret: bool) -> int:
    """Mantissa bits to round away by hand when the interpreter downcasts float32 (0: none)."""
    if not interpret or cdt != torch.float32:
        return 0
    return {torch.bfloat16: 16, torch.float16: 13}.get(out_dtype, 0)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class TritonRowOps:
    """The row-ops backend of :mod:`nemo_azr.kernels.row_ops` as two Triton kernels."""

    name = "triton"
    #: The kernels stream each row, so given logits are processed in one launch (no row chunks).
    chunk_rows = False

    @staticmethod
    def stats(
        z: torch.Tensor, t_local: torch.Tensor, inv_temp: float, need_w: bool, inplace: bool
    ) -> tuple[RowPartials, float, torch.Tensor | None]:
        del inplace  # the kernel only reads z
        z = _rows_contiguous(z)
        rows, n_cols = z.shape
        cdt = compute_dtype(z.dtype)
        m, s, w, tgt = (torch.empty(rows, dtype=cdt, device=z.device) for _ in range(4))
        if rows:
            interpret, meta = _launch_cfg(z, n_cols)
            stats_k, _ = _kernels(interpret)
            stats_k[(rows,)](
                z, z.stride(0), t_local.contiguous(), m, s, w, tgt, n_cols, float(inv_temp),
                NEED_W=bool(need_w), ACC=_acc(z.dtype), **meta,
            )  # fmt: skip
        return RowPartials(m=m, s=s, w=w if need_w else None, tgt=tgt), inv_temp, None

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
        z = _rows_contiguous(z)
        if out.stride(-1) != 1:
            raise ValueError("dlogits needs an output with contiguous rows")
        rows, n_cols = z.shape
        if not rows:
            return
        interpret, meta = _launch_cfg(z, n_cols, dlogits=True)
        _, dlogits_k = _kernels(interpret)
        has_ent = g_ent is not None
        cdt = compute_dtype(z.dtype)
        lse_rel = lse_rel.to(cdt).contiguous()
        g_lp = g_lp.to(cdt).contiguous()
        entropy = entropy.to(cdt).contiguous() if has_ent else lse_rel
        g_ent = g_ent.to(cdt).contiguous() if has_ent else g_lp
        dlogits_k[(rows,)](
            z, z.stride(0), out, out.stride(0), t_local.contiguous(), lse_rel, entropy, g_lp, g_ent,
            n_cols, float(in_scale), float(out_scale), HAS_ENT=has_ent, ONEHOT=bool(onehot),
            RTNE_DROP=_interpreter_rounding(out.dtype, cdt, interpret), ACC=_acc(z.dtype), **meta,
        )  # fmt: skip
