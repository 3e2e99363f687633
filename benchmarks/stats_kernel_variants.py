"""Stats-kernel variants (log-sum-exp statistics + target logit of bf16 logits rows), timed side by
side on one GPU with the production kernel and a torch copy / amax as bandwidth references.

The variants take base-2 exponentials and sweep the column tile, the warps, the loop's pipeline
stages and per-lane sums; each is checked against the production kernel (log-sum-exp to 1e-3, target
logits exactly) before it is timed. Writes ``$OUT/stats_variants.json`` (default /tmp); the committed
run is benchmarks/results/stats_kernel_variants.{md,json}.

    python benchmarks/stats_kernel_variants.py    # CUDA only
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from nemo_azr.kernels import triton_logprobs as tk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_gpu import _time  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def stats_exp2(
    Z,
    stride_z,
    T,
    M,
    S,
    TGT,
    n_cols,
    scale2,
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,
    LANE_SUM: tl.constexpr,
):
    # m, s in log2 units: u2 = u * inv_temp * log2(e); s = sum 2^(u2 - m2)
    row = tl.program_id(0).to(tl.int64)
    z_ptr = Z + row * stride_z
    t = tl.load(T + row)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    s_vec = tl.zeros((BLOCK_V,), tl.float32)
    for start in tl.range(0, n_cols, BLOCK_V, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < n_cols
        u = tl.load(z_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32) * scale2
        m_new = tl.maximum(m, tl.max(u, 0))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - base)
        e = tl.exp2(u - base)
        if LANE_SUM:
            s_vec = s_vec * alpha + e
        else:
            s = s * alpha + tl.sum(e, 0)
        m = m_new
    if LANE_SUM:
        s = tl.sum(s_vec, 0)
    has_t = (t >= 0) & (t < n_cols)
    tgt = tl.where(has_t, tl.load(z_ptr + t, mask=has_t, other=0.0).to(tl.float32), 0.0)
    tl.store(M + row, m / 1.4426950408889634)
    tl.store(S + row, s)
    tl.store(TGT + row, tgt)


def run_variant(z, t, block, warps, stages, lane):
    rows, n = z.shape
    m, s, tgt = (torch.empty(rows, device=z.device, dtype=torch.float32) for _ in range(3))
    stats_exp2[(rows,)](
        z, z.stride(0), t, m, s, tgt, n, LOG2E, BLOCK_V=block, STAGES=stages, LANE_SUM=lane, num_warps=warps
    )
    return m, s, tgt


def run_prod(z, t):
    part, _, _ = tk.TritonRowOps.stats(z, t, 1.0, False, False)
    return part.m, part.s, part.tgt


def timed(fn, *args) -> float:
    """Median seconds of ``fn(*args)`` over 20 calls (kernels_gpu.py's timer)."""
    return _time(fn, 20, *args)[0]


def main():
    bw = 4.8e12
    rows = 8192
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows, "vocabs": {}}
    for name, vocab in (("smollm2", 49152), ("llama3", 128256), ("qwen2", 151936)):
        z = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
        t = torch.randint(0, vocab, (rows,), device="cuda")
        nbytes = z.numel() * 2
        res = {}
        dst = torch.empty_like(z)
        res["torch_copy (read+write)"] = timed(torch.Tensor.copy_, dst, z)
        res["torch_amax"] = timed(torch.amax, z, -1)
        res["production"] = timed(run_prod, z, t)
        ref = run_prod(z, t)
        ref_lse = ref[0] + torch.log(ref[1])
        for block in (4096, 8192):
            for warps in (4, 8):
                for stages in (1, 3):
                    for lane in (False, True):
                        key = f"exp2 {block}x{warps} stages{stages}{' lane' if lane else ''}"
                        try:
                            m, s, tg = run_variant(z, t, block, warps, stages, lane)
                            lse = m + torch.log(s)
                            err = float((lse - ref_lse).abs().max())
                            assert err < 1e-3 and torch.equal(tg, ref[2]), (key, err)
                            res[key] = timed(run_variant, z, t, block, warps, stages, lane)
                        except Exception as exc:  # noqa: BLE001
                            print("failed", key, repr(exc)[:300], flush=True)
        table = {}
        for k, sec in res.items():
            moved = 2 * nbytes if k.startswith("torch_copy") else nbytes
            table[k] = {"ms": round(sec * 1e3, 4), "roofline_pct": round(100 * moved / bw / sec, 1)}
        out["vocabs"][name] = table
        best = sorted(((v["ms"], k) for k, v in table.items()))[:5]
        print(
            name,
            json.dumps({k: table[k] for k in ("torch_copy (read+write)", "torch_amax", "production")}),
            flush=True,
        )
        print(name, "fastest:", [(k, table[k]["roofline_pct"]) for _, k in best], flush=True)
        del z, dst
        torch.cuda.empty_cache()
    dest = os.environ.get("OUT", "/tmp")
    with open(os.path.join(dest, "stats_variants.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
