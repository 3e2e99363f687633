#!/usr/bin/env python
"""The log-prob kernels on a GPU: Triton vs the torch fallback vs naive torch vs Liger, per vocabulary.

    python benchmarks/kernels_gpu.py [--rows 8192] [--reps 10] [--results-name kernels_gpu]

Vocabularies: SmolLM2 (49152, hidden 576), Llama-3 (128256, hidden 2048), Qwen2 (151936, hidden 896);
bfloat16 inputs. Three parts:

* ``tune``: the Triton stats kernel (forward log-probs from given logits) and the d-logits kernel over
  column tiles x warps, and torch's ``amax`` over the logits (one read: what a plain one-pass kernel
  reaches on this GPU); the fastest pair per vocabulary runs again as ``triton_tuned`` in the next part.
* ``logprobs``: ``log p(target)`` from given logits ``[N, V]``: forward only (the old-/reference-
  log-prob passes) and forward + backward (a loss on them). Time (median of CUDA-event timings),
  extra peak memory over the inputs, and the fraction of the HBM roofline: the least traffic any
  implementation needs (forward: read the logits once; with backward: read once and write the gradient
  once) over the GPU's peak bandwidth, divided by the measured time.
* ``linear``: log-probs from hidden states and the LM head (the ``[N, V]`` logits never stored), forward
  + backward: ``linear_token_logprobs`` (torch / triton row ops) against naive matmul + log-softmax and
  Liger's fused linear cross entropy (per-token, reduction none). Useful TFLOP/s counts 6 N H V.

Liger (liger-kernel, the peer) is used where it imports; its per-token cross entropy is ``-log p``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_azr.kernels import linear_token_logprobs, token_logprobs  # noqa: E402
from nemo_azr.trainer.flops import device_peak_flops  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VOCABS = {"smollm2": (49152, 576), "llama3": (128256, 2048), "qwen2": (151936, 896)}
#: Peak HBM bandwidth (bytes/s) by device name (vendor data sheets, SXM); the bf16 FLOP/s peak is the
#: trainer's own table (nemo_azr.trainer.flops.PEAK_BF16_FLOPS), the one its MFU uses.
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def _peaks() -> tuple[float, float]:
    """(HBM bytes/s, dense bf16 FLOP/s) of this GPU; nan where a table does not list it."""
    name = torch.cuda.get_device_name()
    bandwidth = next((v for k, v in HBM_BYTES_PER_S.items() if k in name), float("nan"))
    return bandwidth, device_peak_flops("cuda") or float("nan")


def _time(fn, reps: int, *args) -> tuple[float, float]:
    """Median seconds of ``fn(*args)`` and its extra peak GiB (over what was allocated before it)."""
    fn(*args)  # compile / warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(*args)
    torch.cuda.synchronize()
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**30


def _triton_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return token_logprobs(logits, targets, backend="triton")


def _train_step(fn, inputs: tuple, leaves: tuple) -> None:
    """Forward + backward of ``fn(*inputs).sum()``, the leaves' old gradients dropped first."""
    for leaf in leaves:
        leaf.grad = None
    fn(*inputs).sum().backward()


def _liger():
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy, liger_fused_linear_cross_entropy
    except Exception as exc:  # noqa: BLE001 - the peer is optional: say why it is missing
        print(f"liger-kernel not importable: {exc}", flush=True)
        return None, None
    return liger_cross_entropy, liger_fused_linear_cross_entropy


#: The stats kernel's launch knobs the tune part sweeps (module globals of triton_logprobs).
STATS_KNOBS = ("GPU_BLOCK_V", "GPU_NUM_WARPS")
DLOGITS_KNOBS = ("GPU_DLOGITS_BLOCK_V", "GPU_DLOGITS_NUM_WARPS")


def _set_knobs(names: tuple, values: tuple) -> None:
    from nemo_azr.kernels import triton_logprobs as tk

    for name, value in zip(names, values, strict=True):
        setattr(tk, name, value)


def _knobs(names: tuple) -> tuple:
    from nemo_azr.kernels import triton_logprobs as tk

    return tuple(getattr(tk, name) for name in names)


def _label(values: tuple) -> str:
    return "x".join(str(int(v)) for v in values)


def _knobs_of(label: str) -> tuple:
    return tuple(int(x) for x in label.split("x"))


def tune(rows: int, reps: int, bw: float) -> dict:
    """Sweep the stats kernel and the d-logits kernel over column tiles x warps.

    Also times ``x.amax(-1)`` (one read of the logits by torch's reduction kernel): the bandwidth a
    one-pass read reaches on this GPU, next to the roofline's data-sheet peak.
    """
    out = {}
    stats_default, dlogits_default = _knobs(STATS_KNOBS), _knobs(DLOGITS_KNOBS)
    for name, (vocab, _h) in VOCABS.items():
        logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
        tgt = torch.randint(0, vocab, (rows,), device="cuda")
        nbytes = logits.numel() * logits.element_size()
        with torch.no_grad():
            amax_s, _ = _time(lambda x: x.amax(-1), reps, logits)
        timings = {}
        for block in (2048, 4096, 8192, 16384):
            for warps in (4, 8, 16):
                _set_knobs(STATS_KNOBS, (block, warps))
                with torch.no_grad():
                    seconds, _ = _time(_triton_logprobs, reps, logits, tgt)
                timings[_label((block, warps))] = round(seconds * 1e3, 4)
        best = min(timings, key=timings.get)
        _set_knobs(STATS_KNOBS, _knobs_of(best))
        leaf = logits.clone().requires_grad_(True)
        dtimings = {}
        for block in (1024, 2048, 4096, 8192):
            for warps in (4, 8):
                _set_knobs(DLOGITS_KNOBS, (block, warps))
                seconds, _ = _time(_train_step, reps, _triton_logprobs, (leaf, tgt), (leaf,))
                dtimings[_label((block, warps))] = round(seconds * 1e3, 4)
        dbest = min(dtimings, key=dtimings.get)
        _set_knobs(STATS_KNOBS, stats_default)
        _set_knobs(DLOGITS_KNOBS, dlogits_default)
        out[name] = {
            "ms": timings,
            "best": best,
            "best_roofline_pct": round(100 * nbytes / bw / (timings[best] / 1e3), 1),
            "default": _label(stats_default),
            "amax_ms": round(amax_s * 1e3, 4),
            "amax_roofline_pct": round(100 * nbytes / bw / amax_s, 1),
            "dlogits_fwd_bwd_ms": dtimings,
            "dlogits_best": dbest,
            "dlogits_default": _label(dlogits_default),
        }
        print(
            "tune",
            name,
            {k: v for k, v in out[name].items() if k not in ("ms", "dlogits_fwd_bwd_ms")},
            flush=True,
        )
        del logits, leaf
        torch.cuda.empty_cache()
    return out


@contextlib.contextmanager
def _tuned_knobs(tuned: dict):
    """The stats and d-logits knobs the tune part found fastest for one vocabulary, for a block of
    work that includes the backward (which launches the d-logits kernel after the forward returned)."""
    saved = _knobs(STATS_KNOBS), _knobs(DLOGITS_KNOBS)
    _set_knobs(STATS_KNOBS, _knobs_of(tuned["best"]))
    _set_knobs(DLOGITS_KNOBS, _knobs_of(tuned["dlogits_best"]))
    try:
        yield
    finally:
        _set_knobs(STATS_KNOBS, saved[0])
        _set_knobs(DLOGITS_KNOBS, saved[1])


def logprobs(rows: int, reps: int, bw: float, tuned: dict | None = None) -> dict:
    liger_ce, _ = _liger()
    out = {}
    for name, (vocab, _h) in VOCABS.items():
        base = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
        tgt = torch.randint(0, vocab, (rows,), device="cuda")
        nbytes = base.numel() * base.element_size()
        impls = {
            "naive": lambda x, t: x.float().log_softmax(-1).gather(-1, t[:, None])[:, 0],
            "torch": lambda x, t: token_logprobs(x, t, backend="torch"),
            "triton": lambda x, t: token_logprobs(x, t, backend="triton"),
        }
        if tuned and name in tuned:
            impls["triton_tuned"] = _triton_logprobs  # measured under _tuned_knobs below
        if liger_ce is not None:
            impls["liger"] = lambda x, t: -liger_ce(x, t, reduction="none")
        res = {}
        for impl, fn in impls.items():
            knobs = _tuned_knobs(tuned[name]) if impl == "triton_tuned" else contextlib.nullcontext()
            try:
                with knobs:
                    with torch.no_grad():
                        fwd, fwd_mem = _time(fn, reps, base, tgt)
                    leaf = base.clone().requires_grad_(True)
                    both, both_mem = _time(_train_step, reps, fn, (leaf, tgt), (leaf,))
                    del leaf
                res[impl] = {
                    "fwd_ms": round(fwd * 1e3, 3),
                    "fwd_extra_gib": round(fwd_mem, 3),
                    "fwd_roofline_pct": round(100 * nbytes / bw / fwd, 1),
                    "fwd_bwd_ms": round(both * 1e3, 3),
                    "fwd_bwd_extra_gib": round(both_mem, 3),
                    "fwd_bwd_roofline_pct": round(100 * 2 * nbytes / bw / both, 1),
                }
            except Exception as exc:  # noqa: BLE001 - one failing implementation keeps the others
                res[impl] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            print("logprobs", name, impl, res[impl], flush=True)
        out[name] = {"vocab": vocab, "logits_gib": round(nbytes / 2**30, 3), "impls": res}
        del base
        torch.cuda.empty_cache()
    return out


def linear(rows: int, reps: int, flops_peak: float) -> dict:
    _, liger_flce = _liger()
    out = {}
    for name, (vocab, hidden) in VOCABS.items():
        w0 = (torch.randn(vocab, hidden, device="cuda") * hidden**-0.5).to(torch.bfloat16)
        h0 = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        tgt = torch.randint(0, vocab, (rows,), device="cuda")
        impls = {
            "naive": lambda h, w, t: (h @ w.T).float().log_softmax(-1).gather(-1, t[:, None])[:, 0],
            "torch": lambda h, w, t: linear_token_logprobs(h, w, t, backend="torch"),
            "triton": lambda h, w, t: linear_token_logprobs(h, w, t, backend="triton"),
            # larger token chunks: fewer, bigger GEMMs (the 1024 default was sized for CPU memory)
            "triton_chunk4096": lambda h, w, t: linear_token_logprobs(
                h, w, t, backend="triton", chunk_size=4096
            ),
            "triton_chunk8192": lambda h, w, t: linear_token_logprobs(
                h, w, t, backend="triton", chunk_size=8192
            ),
        }
        if liger_flce is not None:
            impls["liger"] = lambda h, w, t: -liger_flce(h, w, t, reduction="none")
        res = {}
        for impl, fn in impls.items():
            h, w = h0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
            try:
                seconds, mem = _time(_train_step, reps, fn, (h, w, tgt), (h, w))
                res[impl] = {
                    "fwd_bwd_ms": round(seconds * 1e3, 3),
                    "extra_gib": round(mem, 3),
                    "useful_tflops": round(6 * rows * hidden * vocab / seconds / 1e12, 1),
                    "pct_of_bf16_peak": round(100 * 6 * rows * hidden * vocab / seconds / flops_peak, 1),
                }
            except Exception as exc:  # noqa: BLE001
                res[impl] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            print("linear", name, impl, res[impl], flush=True)
            del h, w
        out[name] = {"vocab": vocab, "hidden": hidden, "impls": res}
        del w0, h0
        torch.cuda.empty_cache()
    return out


def _impl_table(title: str, part: dict, lead: list[str], headers: list[str], fields: list[str]) -> list[str]:
    """A section with one row per (vocabulary, implementation); a failed implementation shows its error."""
    lines = [f"## {title}", "", "| " + " | ".join([*lead, "impl", *headers]) + " |"]
    lines.append("| " + " | ".join(["---"] * (len(lead) + 1 + len(headers))) + " |")
    for name, r in part.items():
        cells = [f"{name} {r['vocab']}", *(str(r[k]) for k in lead[1:])]
        for impl, v in r["impls"].items():
            values = [v["error"], *[""] * (len(fields) - 1)] if "error" in v else [str(v[f]) for f in fields]
            lines.append("| " + " | ".join([*cells, impl, *values]) + " |")
    return [*lines, ""]


def _markdown(result: dict) -> str:
    lines = [
        "# Log-prob kernels on a GPU: Triton vs torch vs naive vs Liger",
        "",
        f"Device: {result['device']}, torch {result['torch']}, triton {result['triton']}, liger-kernel "
        f"{result['liger']}; bfloat16; {result['rows']} rows; run {result['date']}.  ",
        f"Command: `{result['command']}`. Roofline: peak HBM {result['hbm_tb_s']} TB/s, dense bf16 "
        f"{result['bf16_tflops']} TFLOP/s (data sheet).",
        "",
    ]
    if "logprobs" in result:
        lines += _impl_table(
            "Log-probs from given logits",
            result["logprobs"],
            ["vocab"],
            [
                "fwd ms",
                "fwd extra GiB",
                "fwd % HBM roofline",
                "fwd+bwd ms",
                "fwd+bwd extra GiB",
                "fwd+bwd % roofline",
            ],
            [
                "fwd_ms",
                "fwd_extra_gib",
                "fwd_roofline_pct",
                "fwd_bwd_ms",
                "fwd_bwd_extra_gib",
                "fwd_bwd_roofline_pct",
            ],
        )
    if "linear" in result:
        lines += _impl_table(
            "Log-probs from hidden states and the LM head, forward + backward",
            result["linear"],
            ["vocab", "hidden"],
            ["ms", "extra GiB", "useful TFLOP/s", "% bf16 peak"],
            ["fwd_bwd_ms", "extra_gib", "useful_tflops", "pct_of_bf16_peak"],
        )
    if "tune" in result:
        lines += [
            "## Triton kernels: launch sweep",
            "",
            "Stats kernel (forward ms), labels tile x warps; d-logits "
            "kernel (forward + backward ms), labels tile x warps. `amax`: torch reading the logits "
            "once (what a one-pass read reaches here).",
            "",
        ]
        for name, r in result["tune"].items():
            cells = ", ".join(f"{k} {v}" for k, v in r["ms"].items())
            dcells = ", ".join(f"{k} {v}" for k, v in r["dlogits_fwd_bwd_ms"].items())
            lines.append(
                f"- {name}: stats best {r['best']} ({r['ms'][r['best']]} ms, {r['best_roofline_pct']}% "
                f"of the roofline), default {r['default']} ({r['ms'].get(r['default'])} ms); amax "
                f"{r['amax_ms']} ms ({r['amax_roofline_pct']}%); d-logits best {r['dlogits_best']}, "
                f"default {r['dlogits_default']}. Stats: {cells}. D-logits: {dcells}"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--parts", nargs="+", default=["tune", "logprobs", "linear"])
    ap.add_argument("--results-name", default="kernels_gpu")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernels_gpu.py measures CUDA kernels; no GPU here")
    import triton

    bw, flops = _peaks()
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        liger_version = version("liger-kernel")
    except Exception:  # noqa: BLE001
        liger_version = "missing"
    result: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": liger_version,
        "rows": args.rows,
        "hbm_tb_s": bw / 1e12,
        "bf16_tflops": flops / 1e12,
        "command": "python benchmarks/kernels_gpu.py " + " ".join(sys.argv[1:]),
    }
    if "tune" in args.parts:
        result["tune"] = tune(args.rows, args.reps, bw)
    if "logprobs" in args.parts:
        result["logprobs"] = logprobs(args.rows, args.reps, bw, result.get("tune"))
    if "linear" in args.parts:
        result["linear"] = linear(args.rows, args.reps, flops)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = _markdown(result)
    (RESULTS / f"{args.results_name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
