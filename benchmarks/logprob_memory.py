#!/usr/bin/env python
"""Extra peak memory and time of a log-prob policy loss, forward + backward, at a Qwen-sized vocabulary.

Setting (defaults): N = 4096 tokens, hidden H = 896, vocabulary V = 151936, float32 on CPU. Every case
computes the token log-probs of the LM head ``hidden[N, H] @ weight[V, H].T`` at the targets, a scalar
loss of them, and the gradients for ``hidden`` and ``weight``:

* ``naive``: ``log_softmax(hidden @ weight.T).gather(targets)`` on the full ``[N, V]`` logits, then
  ``policy_objective`` (on-policy PPO clip, token-mean), autograd backward;
* ``torch_chunked``: the torch fallback :func:`nemo_azr.kernels.linear_token_logprobs` (token chunks;
  the backward recomputes each chunk's logits), then ``policy_objective``;
* ``fused``: :func:`nemo_azr.kernels.fused_linear_policy_loss` with the torch row ops (the best CPU
  path: one pass, gradients written per chunk, no recompute; same loss as the two above);
* ``liger``: liger-kernel's ``LigerFusedLinearCrossEntropyLoss`` (the peer; mean cross entropy, i.e.
  the same log-probs with a constant per-token weight). Its kernels are Triton only: on a machine
  without a GPU it runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``), so its time measures
  the interpreter, not Liger; its memory is still its algorithm's (chunked logits + gradients).

Each case runs in its own subprocess. After a tiny warm-up of the code path, ``/proc/self/clear_refs``
resets the RSS high-water mark; *extra peak* = ``VmHWM`` during forward + backward minus the RSS just
before it (inputs already allocated; the gradient buffers count as extra in every case). glibc's
mmap threshold is fixed at 1 MiB so freed tensors go back to the OS and RSS tracks live tensors.
Cases are interleaved for ``--reps`` repetitions (medians reported).

Run with the benchmark venv (liger-kernel and triton installed, see benchmarks/README.md):

    .venv-bench/bin/python benchmarks/logprob_memory.py

Writes benchmarks/results/logprob_memory.json and benchmarks/results/logprob_memory.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, mem_total_gib, peak_rss, reset_peak_rss

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
CASES = ("naive", "torch_chunked", "fused", "liger")
TARGETS = {"memory": 1 / 8, "time": 1.0}  # vs naive: extra memory <= 1/8, time <= 1x
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "PYTHONWARNINGS": "ignore"}


# ---------------------------------------------------------------------------------------------------
# worker: one case per process
# ---------------------------------------------------------------------------------------------------
def _make_case(case: str, n: int, h: int, v: int, chunk: int):
    """(warm-up fn on tiny inputs, measured fn) -> each returns the scalar loss after backward."""
    import torch

    from nemo_azr.algorithms.objective import policy_objective
    from nemo_azr.config.schema import AlgorithmConfig
    from nemo_azr.kernels import fused_linear_policy_loss, linear_token_logprobs

    cfg = AlgorithmConfig(loss="ppo_clip", loss_agg_mode="token-mean", dual_clip=True)

    def ppo(lp, adv):
        lp2 = lp.view(1, -1)
        loss, _ = policy_objective(
            logprobs=lp2,
            old_logprobs=lp2.detach(),
            advantages=adv.view(1, -1),
            loss_mask=torch.ones_like(lp2),
            cfg=cfg,
        )
        return loss

    def naive(hid, w, t, adv):
        lp = torch.log_softmax(hid @ w.t(), dim=-1).gather(-1, t[:, None])[:, 0]
        return ppo(lp, adv)

    def chunked(hid, w, t, adv):
        return ppo(linear_token_logprobs(hid, w, t, backend="torch", chunk_size=chunk), adv)

    def fused(hid, w, t, adv):
        loss, _ = fused_linear_policy_loss(
            hid[None],
            w,
            t[None],
            advantages=adv[None],
            loss_mask=torch.ones(1, t.shape[0]),
            cfg=cfg,
            backend="torch",
            chunk_size=chunk,
        )
        return loss

    def liger(hid, w, t, adv):
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        return LigerFusedLinearCrossEntropyLoss(reduction="mean")(w, hid, t)

    fn = {"naive": naive, "torch_chunked": chunked, "fused": fused, "liger": liger}[case]

    def data(n_, v_, seed):
        g = torch.Generator().manual_seed(seed)
        hid = torch.randn(n_, h, generator=g).requires_grad_(True)
        w = (torch.randn(v_, h, generator=g) * 0.05).requires_grad_(True)
        t = torch.randint(0, v_, (n_,), generator=g)
        adv = torch.randn(n_, generator=g)
        return hid, w, t, adv

    def run(args):
        loss = fn(*args)
        loss.backward()
        return float(loss.detach())

    return (lambda: run(data(8, 1000, 1))), data(n, v, 0), run


def worker_main(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    warm, inputs, run = _make_case(args.worker, args.tokens, args.hidden, args.vocab, args.chunk_size)
    warm()
    rss_before = reset_peak_rss()
    t0 = time.perf_counter()
    loss = run(inputs)
    elapsed = time.perf_counter() - t0
    peak = peak_rss()
    hid, w = inputs[0], inputs[1]
    result = {
        "case": args.worker,
        "time_s": elapsed,
        "rss_before_kib": rss_before,
        "peak_rss_kib": peak,
        "extra_peak_kib": peak - rss_before,
        "loss": loss,
        "grad_hidden_norm": float(hid.grad.norm()),
        "grad_weight_norm": float(w.grad.norm()),
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }
    Path(args.result_file).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------
def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "triton", "liger-kernel", "numpy", "nemo_azr"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _run_case(case: str, args, tmp: Path, tag: str) -> dict:
    result_file = tmp / f"{tag}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        case,
        "--tokens",
        str(args.tokens),
        "--hidden",
        str(args.hidden),
        "--vocab",
        str(args.vocab),
        "--chunk-size",
        str(args.chunk_size),
        "--threads",
        str(args.threads),
        "--result-file",
        str(result_file),
    ]
    env = {**os.environ, **WORKER_ENV}
    if case == "liger":
        env["TRITON_INTERPRET"] = "1"  # before triton is imported: the CPU interpreter
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"timed out after {args.case_timeout} s"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result_file.is_file():
        tail = (proc.stdout[-1000:] + proc.stderr[-3000:]).strip().splitlines()
        return {"case": case, "error": f"exit {proc.returncode}: {tail[-1] if tail else ''}"}
    res = json.loads(result_file.read_text())
    res["process_wall_s"] = wall
    return res


def _mib(kib: float) -> float:
    return kib / 1024.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument(
        "--chunk-size", type=int, default=256, help="token chunk of the chunked paths (0: hf's auto, ~64 MiB)"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the non-liger cases")
    ap.add_argument("--liger-reps", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--case-timeout", type=int, default=3600)
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    if args.chunk_size <= 0:
        from nemo_azr.models.hf.policy import auto_chunk_size

        args.chunk_size = auto_chunk_size(args.vocab)
    if args.worker:
        worker_main(args)
        return
    if not Path("/proc/self/clear_refs").exists():
        raise SystemExit("needs Linux /proc/self/clear_refs to reset the peak-RSS high-water mark")

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    command = shlex.join([sys.executable, *sys.argv])
    load_before = os.getloadavg()
    started = _dt.datetime.now(_dt.timezone.utc)
    t_start = time.perf_counter()
    raw: dict[str, list] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="logprob_memory_") as tmp:
        for r in range(max(args.reps, args.liger_reps)):
            for c in cases:
                if r >= (args.liger_reps if c == "liger" else args.reps):
                    continue
                res = _run_case(c, args, Path(tmp), f"{r}-{c}")
                raw[c].append(res)
                if "error" in res:
                    print(f"[rep {r + 1}] {c:14s} FAILED: {res['error']}", flush=True)
                else:
                    print(
                        f"[rep {r + 1}] {c:14s} time {res['time_s']:7.1f} s  extra peak "
                        f"{_mib(res['extra_peak_kib']):8.1f} MiB  loss {res['loss']:.6f}",
                        flush=True,
                    )
    elapsed = time.perf_counter() - t_start
    load_after = os.getloadavg()

    summary = {}
    for c in cases:
        ok = [x for x in raw[c] if "error" not in x]
        if not ok:
            summary[c] = {"error": raw[c][0]["error"] if raw[c] else "not run"}
            continue
        summary[c] = {
            "time_s": statistics.median(x["time_s"] for x in ok),
            "extra_peak_mib": statistics.median(_mib(x["extra_peak_kib"]) for x in ok),
            "runs": len(ok),
            "loss": ok[0]["loss"],
            "grad_hidden_norm": ok[0]["grad_hidden_norm"],
            "grad_weight_norm": ok[0]["grad_weight_norm"],
        }
    base = summary.get("naive", {})
    for s in summary.values():
        if "error" in s or "error" in base or not base:
            continue
        s["memory_vs_naive"] = s["extra_peak_mib"] / base["extra_peak_mib"]
        s["time_vs_naive"] = s["time_s"] / base["time_s"]
    report = {
        "benchmark": "logprob_memory",
        "date_utc": started.isoformat(timespec="seconds"),
        "command": command,
        "total_time_s": elapsed,
        "setting": {
            "tokens": args.tokens,
            "hidden": args.hidden,
            "vocab": args.vocab,
            "dtype": "float32",
            "device": "cpu",
            "chunk_size": args.chunk_size,
            "torch_threads": args.threads,
            "reps": args.reps,
            "liger_reps": args.liger_reps,
            "full_logits_mib": args.tokens * args.vocab * 4 / 2**20,
            "weight_grad_mib": args.vocab * args.hidden * 4 / 2**20,
            "chunk_logits_mib": args.chunk_size * args.vocab * 4 / 2**20,
        },
        "targets": TARGETS,
        "summary": summary,
        "raw": raw,
        "machine": {
            "cpu": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "available_cpus": len(os.sched_getaffinity(0)),
            "ram_gib": mem_total_gib(),
            "kernel": platform.release(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "versions": _versions(),
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "logprob_memory.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "logprob_memory.md").write_text(render_markdown(report))
    print(f"wrote {out_dir / 'logprob_memory.json'} and {out_dir / 'logprob_memory.md'}")


def render_markdown(report: dict) -> str:
    s, st, m, v = report["summary"], report["setting"], report["machine"], report["versions"]
    lines = [
        "# Log-prob policy loss: extra peak memory and time, forward + backward (CPU, fp32)",
        "",
        f"Date (UTC): {report['date_utc']}  ",
        f"Command: `{report['command']}`  ",
        f"Total benchmark time: {report['total_time_s']:.0f} s",
        "",
        "## Setting",
        "",
        f"- N = {st['tokens']} tokens, H = {st['hidden']}, V = {st['vocab']}, float32 on CPU, "
        f"{st['torch_threads']} torch threads; token chunk {st['chunk_size']} "
        f"({st['chunk_logits_mib']:.0f} MiB of float32 logits).",
        "- Loss: on-policy PPO clip (token-mean, `policy_objective`) of the token log-probs; liger: mean "
        "cross entropy (same log-probs, constant weights). Gradients for hidden and weight.",
        f"- One `[N, V]` float32 matrix is {st['full_logits_mib']:.0f} MiB; the weight gradient "
        f"`[V, H]` is {st['weight_grad_mib']:.0f} MiB (counted as extra in every case).",
        "- Each case in its own process; `/proc/self/clear_refs` resets the RSS high-water mark after a "
        "tiny warm-up; extra peak = VmHWM during forward + backward - RSS just before (inputs allocated). "
        f"Medians over {st['reps']} repetition(s) (liger: {st['liger_reps']}), cases interleaved.",
        "",
        "## Results",
        "",
        "| case | time (s) | extra peak (MiB) | memory / naive | time / naive | loss | runs |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c, r in s.items():
        if "error" in r:
            lines.append(f"| {c} | - | - | - | - | failed: {r['error']} | 0 |")
            continue
        lines.append(
            f"| {c} | {r['time_s']:.1f} | {r['extra_peak_mib']:.0f} | {r.get('memory_vs_naive', float('nan')):.3f} "
            f"| {r.get('time_vs_naive', float('nan')):.2f} | {r['loss']:.6f} | {r['runs']} |"
        )
    lines += ["", "## Targets (CPU): extra memory <= 1/8 of naive at no more than naive's time", ""]
    lines += ["| case | memory / naive (<= 0.125) | time / naive (<= 1.0) |", "| --- | --- | --- |"]
    for c in ("torch_chunked", "fused"):
        r = s.get(c, {})
        if "memory_vs_naive" not in r:
            continue
        mem_ok = "PASS" if r["memory_vs_naive"] <= TARGETS["memory"] else "FAIL"
        time_ok = "PASS" if r["time_vs_naive"] <= TARGETS["time"] else "FAIL"
        lines.append(f"| {c} | {r['memory_vs_naive']:.3f} {mem_ok} | {r['time_vs_naive']:.2f} {time_ok} |")
    lines += ["", "## Per-run numbers", ""]
    for c, runs in report["raw"].items():
        parts = [
            x["error"] if "error" in x else f"{x['time_s']:.1f} s / {_mib(x['extra_peak_kib']):.0f} MiB"
            for x in runs
        ]
        lines.append(f"- {c}: " + "; ".join(parts))
    lines += [
        "",
        "## Notes",
        "",
        "- liger-kernel's kernels are Triton only. Without a GPU, `LigerFusedLinearCrossEntropyLoss` runs "
        "in Triton's CPU interpreter (`TRITON_INTERPRET=1`, one Python-level numpy step per tile), so its "
        "time measures the interpreter, not Liger; its memory is its algorithm's (chunked logits, "
        "gradients computed in the forward) plus the interpreter's host copies of each launch's tensors.",
        "- nemo_azr's `triton` backend is not timed here for the same reason (it is tested for correctness "
        "under the interpreter); `fused` and `torch_chunked` use the torch row ops.",
        "- `fused` computes the gradients during the forward (three GEMMs in all, like naive); "
        "`torch_chunked` keeps only per-token statistics and recomputes each chunk's logits in the "
        "backward (four GEMMs): less memory-hungry in principle, slower.",
        "- GPU part of issue 5 (bf16 on a GPU: time vs naive and vs Liger, fraction of the "
        "memory-bandwidth roofline) not measured: no GPU was available to this run.",
        "- The machine is shared with other jobs; see the load averages below and the per-run numbers.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, {m['logical_cpus']} logical CPUs ({m['available_cpus']} available); "
        f"RAM {m['ram_gib']:.1f} GiB; kernel {m['kernel']}",
        f"- Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in m['loadavg_before'])}; "
        f"after: {', '.join(f'{x:.2f}' for x in m['loadavg_after'])}",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
