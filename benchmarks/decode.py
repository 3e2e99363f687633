#!/usr/bin/env python
"""Rollout decode speed of the hf backend: the dynamic loop against the static cache (+ CUDA graphs).

    python benchmarks/decode.py --model DIR [--device cuda] [--prompts 64] [--n 8] [--new-tokens 128]

Cases, side by side in one process on one model copy:
* ``dynamic``        today's loop (``generation.decode=dynamic``): the cache grows per token;
* ``static_eager``   the static cache, the step run eagerly (what CPU runs);
* ``static_graphs``  the static cache, the step replayed from a CUDA graph (CUDA only);
* ``*_grouped``      the same with the step's attention by ``gqa_decode_attention`` (each KV head
  read once for its query heads) instead of the model's own sdpa.

Per case: generated tokens/s (median of ``--reps`` calls after one warm-up call), the first call after
``release()`` (a shape recorded again, as after each training step), and peak GPU memory. Fidelity:
greedy tokens of each case against ``dynamic`` (rows identical, first differing column), in the
model's dtype and again in float32; sampled rows' log-probs against a teacher-forced forward.
Random-weight models rarely emit EOS, so every row runs ``--new-tokens`` tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_azr.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402
from nemo_azr.rollout.hf_backend import HFGenerationBackend  # noqa: E402
from nemo_azr.rollout.single_turn import encode_prompt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _prompts(tokenizer, count: int) -> list[list[int]]:
    return [
        encode_prompt(
            tokenizer, [{"role": "user", "content": f"What is {17 * i % 97} + {31 * i % 89}? Explain."}]
        )
        for i in range(count)
    ]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(backend, requests, sp, device) -> tuple[float, list]:
    _sync(device)
    t0 = time.perf_counter()
    outs = backend.generate(requests, sp)
    _sync(device)
    return time.perf_counter() - t0, [s for o in outs for s in o.samples]


def _backend(model, tok, case: str) -> HFGenerationBackend:
    decode = "dynamic" if case == "dynamic" else "static"
    return HFGenerationBackend(
        model,
        tok,
        decode=decode,
        cuda_graphs=case.startswith("static_graphs"),
        grouped_attention=case.endswith("_grouped"),
    )


def _teacher_forced_gap(model, prompts, samples, n: int, temperature: float) -> float:
    """Max |rollout log-prob - full-forward log-prob| over the sampled tokens (same weights)."""
    worst = 0.0
    with torch.no_grad():
        for i, s in enumerate(samples[: 4 * n]):
            ids = torch.tensor([prompts[i // n] + s.token_ids], device=model.device)
            logits = model(input_ids=ids).logits[0, len(prompts[i // n]) - 1 : -1].float()
            ref = (
                (logits / temperature).log_softmax(-1).gather(-1, ids[0, len(prompts[i // n]) :, None])[:, 0]
            )
            worst = max(worst, (ref - torch.tensor(s.logprobs, device=ref.device)).abs().max().item())
    return worst


def _agreement(want: list, got: list) -> dict:
    same = sum(a.token_ids == b.token_ids for a, b in zip(want, got))
    first_diff = [
        next(
            (j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
            min(len(a.token_ids), len(b.token_ids)),
        )
        for a, b in zip(want, got)
        if a.token_ids != b.token_ids
    ]
    return {
        "rows": len(want),
        "rows_identical": same,
        "first_diff_median": statistics.median(first_diff) if first_diff else None,
    }


def _measure(model, tok, case, requests, prompts, sampled, greedy, args, device) -> tuple[dict, list]:
    """One case: tokens/s over ``args.reps`` calls, a call after release, log-prob gap, greedy samples."""
    backend = _backend(model, tok, case)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _timed(backend, requests, sampled, device)  # warm-up (and, for graphs, the recording)
    times, tokens = [], 0
    for _ in range(args.reps):
        seconds, samples = _timed(backend, requests, sampled, device)
        times.append(seconds)
        tokens = sum(len(s.token_ids) for s in samples)
    backend.release()
    cold, _ = _timed(backend, requests, sampled, device)  # a shape recorded again, as after a train step
    gap = _teacher_forced_gap(model, prompts, samples, args.n, 1.0)
    _, greedy_samples = _timed(backend, requests, greedy, device)
    med = statistics.median(times)
    row = {
        "median_s": round(med, 4),
        "tokens": tokens,
        "tokens_per_s": round(tokens / med, 1),
        "first_call_after_release_s": round(cold, 4),
        "sampled_logprob_max_gap": round(gap, 5),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        "graphs_captured": backend._static.graphs_captured if backend._static is not None else 0,
    }
    print(case, row, flush=True)
    backend.release()
    return row, greedy_samples


def _profile(model, tok, requests, n: int, *, grouped: bool) -> None:
    """Top kernels by GPU time of 16 eagerly run static-cache steps (where the step's time goes)."""
    from torch.profiler import ProfilerActivity, profile

    print(f"profile: static cache, {'grouped-query' if grouped else 'the model'} attention", flush=True)
    backend = HFGenerationBackend(model, tok, decode="static", cuda_graphs=False, grouped_attention=grouped)
    sp = SamplingParams(n=n, temperature=1.0, max_new_tokens=16)
    backend.generate(requests, sp)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        backend.generate(requests, sp)
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fp32-prompts", type=int, default=16, help="prompts of the float32 greedy check")
    ap.add_argument("--results-name", default="decode_gpu")
    ap.add_argument("--profile", action="store_true", help="print the top GPU kernels of eager static steps")
    ap.add_argument("--cases", nargs="+", default=None, help="cases to run (default: all; dynamic always)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa", dtype=dtype).to(
        device
    )
    prompts = _prompts(tok, args.prompts)
    requests = [GenerationRequest(p) for p in prompts]
    cases = ["dynamic", "static_eager", "static_eager_grouped"]
    if device.type == "cuda":
        cases += ["static_graphs", "static_graphs_grouped"]
    if args.cases:  # the baseline every ratio and fidelity check is taken against stays
        cases = ["dynamic", *[c for c in cases if c in args.cases and c != "dynamic"]]
    sampled = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens)
    greedy = SamplingParams(n=args.n, greedy=True, max_new_tokens=args.new_tokens)

    rows: dict[str, dict] = {}
    greedy_out: dict[str, list] = {}
    for case in list(cases):
        try:
            rows[case], greedy_out[case] = _measure(
                model, tok, case, requests, prompts, sampled, greedy, args, device
            )
        except Exception as exc:  # noqa: BLE001 - a failing case keeps the others
            print(f"{case} failed: {type(exc).__name__}: {exc}", flush=True)
            cases.remove(case)

    base = rows["dynamic"]["tokens_per_s"]
    for case in cases:
        rows[case]["speedup"] = round(rows[case]["tokens_per_s"] / base, 2)
        rows[case]["greedy_vs_dynamic"] = _agreement(greedy_out["dynamic"], greedy_out[case])

    # float32: greedy equality without bf16 rounding differences between the two attention layouts
    if args.profile and device.type == "cuda":  # before the float32 check converts the model
        _profile(model, tok, requests, args.n, grouped=False)
        _profile(model, tok, requests, args.n, grouped=True)
    model32 = model.float()
    small = requests[: args.fp32_prompts]
    fp32 = {}
    for case in cases:
        try:
            fp32[case] = _timed(_backend(model32, tok, case), small, greedy, device)[1]
        except Exception as exc:  # noqa: BLE001
            print(f"float32 {case} failed: {type(exc).__name__}: {exc}", flush=True)
    fp32_agreement = {c: _agreement(fp32["dynamic"], out) for c, out in fp32.items()}

    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": gpu,
        "torch": torch.__version__,
        "dtype": args.dtype,
        "model": str(args.model),
        "shape": {"prompts": args.prompts, "n": args.n, "new_tokens": args.new_tokens},
        "cases": rows,
        "fp32_greedy_vs_dynamic": fp32_agreement,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Rollout decode: dynamic loop vs static cache (+ CUDA graphs), hf backend",
        "",
        f"Device: {gpu}, torch {torch.__version__}, {args.dtype}; run {result['date']}.  ",
        f"Command: `python benchmarks/decode.py {' '.join(sys.argv[1:])}`.  ",
        f"{args.prompts} prompts x {args.n} samples x {args.new_tokens} new tokens, temperature 1.0; "
        "random weights (every row runs to the token limit). Median of "
        f"{args.reps} calls after a warm-up call; ratios side by side in this one process.",
        "",
        "| case | median s | tokens/s | speed-up | first call after release s | peak GiB | greedy rows = dynamic | "
        "sampled log-prob max gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in cases:
        r = rows[case]
        agree = r["greedy_vs_dynamic"]
        lines.append(
            f"| {case} | {r['median_s']} | {r['tokens_per_s']} | {r['speedup']}x | {r['first_call_after_release_s']} "
            f"| {r['peak_gib']} | {agree['rows_identical']}/{agree['rows']} | {r['sampled_logprob_max_gap']} |"
        )
    lines += [
        "",
        f"float32 greedy, {args.fp32_prompts} prompts x {args.n}: "
        + ", ".join(
            f"{c} {a['rows_identical']}/{a['rows']} rows = dynamic" for c, a in fp32_agreement.items()
        ),
        "",
    ]
    (RESULTS / f"{args.results_name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
