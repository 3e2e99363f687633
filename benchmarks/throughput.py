#!/usr/bin/env python
"""Throughput levers side by side in one run: sequence packing, token-budget micro-batches, async rollout.

Three parts, all on this machine (CPU) in one invocation:

1. ``update``: the training forward/backward of one RL batch on SmolLM2-135M-Instruct (``--model``,
   default the ``smollm2-135m`` preset; ``tiny`` for the built-in model), its response lengths drawn
   from a long-tailed distribution like real RL rollouts (log-normal, most short, a few at the cap).
   Cases on the same batch, interleaved over ``--reps``: ``padded`` (fixed ``micro_batch_size`` rows,
   every row as wide as the batch: the default), ``padded_budget`` (token-budget micro-batches, each
   trimmed to its width) and ``packed`` (token budget on real tokens, the rows of a micro-batch run
   as one packed sequence). Training tokens/s = real (prompt + response) tokens / forward+backward time.
2. ``e2e``: ``nemo-azr train`` on the SmolLM2 arithmetic experiment for ``--e2e-steps`` steps, each of
   {padded, packed} x {sync, async lag 1 with TIS} (async also with the cores split between the
   rollout and training threads, and with the decode loop in a process of its own:
   ``rollout.async_generation=process``); ``--e2e-experiment default`` trains the default job (tiny
   model) instead; end-to-end steps/s from the median step time (the first step,
   start-up, left out).
3. ``curve``: the default job (tiny model, 400 steps) synchronous vs async lag 1 with TIS (thread and
   process), same seeds
   (``--curve-seeds``) and samples: the training reward of the first / last 50 steps, and its spread
   over seeds as the noise yardstick.

    .venv/bin/python benchmarks/throughput.py            # all three parts
    .venv/bin/python benchmarks/throughput.py --parts update --reps 3

On a GPU (``--device cuda``; the real weights may be out of reach there, see random_weights.py):

    python benchmarks/throughput.py --device cuda --model DIR --results-name throughput_h100 \
        --e2e-overrides model.path=DIR trainer.device=cuda --e2e-cases padded_sync padded_async

Results: benchmarks/results/throughput.{json,md} (``--results-name`` for another name).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from machine import cpu_model, mem_total_gib
from real_model import RESULTS_DIR, nemo_azr, read_jsonl, run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_azr.contracts import Batch  # noqa: E402
from nemo_azr.contracts import fields as F  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.models.hf.policy import HFPolicy  # noqa: E402
from nemo_azr.models.tiny import resolve_model_path  # noqa: E402
from nemo_azr.models.training.microbatch import real_lengths  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402

UPDATE_CASES = {
    "padded": [],
    "padded_budget": ["algorithm.max_tokens_per_microbatch={budget}"],
    "packed": ["model.sequence_packing=true", "algorithm.max_tokens_per_microbatch={budget}"],
}
PACKED = ["model.sequence_packing=true", "algorithm.max_tokens_per_microbatch={budget}"]
ASYNC = ["rollout.async_rollout=true", "rollout.max_policy_lag=1", "algorithm.off_policy_correction=tis"]
#: The decode loop in the producer thread (the named cases pin it: the default, auto, depends on the device).
THREAD = ["rollout.async_generation=thread"]
#: Generation and training split the cores (one torch thread each) instead of both using all of them.
SPLIT_THREADS = ["trainer.num_threads=1", "rollout.async_threads=1"]
PROCESS = ["rollout.async_generation=process"]
E2E_CASES = {
    "padded_sync": [],
    # the decode loop before the static cache (generation.decode=auto is static on CUDA)
    "padded_sync_dynamic": ["generation.decode=dynamic"],
    "packed_sync": PACKED,
    "padded_async": [*ASYNC, *THREAD],
    "padded_async_split": [*ASYNC, *THREAD, *SPLIT_THREADS],
    "packed_async": [*PACKED, *ASYNC, *THREAD],
    "packed_async_split": [*PACKED, *ASYNC, *THREAD, *SPLIT_THREADS],
    # the decode loop in a process of its own (its own GIL); _split: the cores split between the two
    "padded_async_process": [*ASYNC, *PROCESS],
    "padded_async_process_split": [*ASYNC, *PROCESS, *SPLIT_THREADS],
    "packed_async_process": [*PACKED, *ASYNC, *PROCESS],
}
CURVE_CASES = {
    "sync": [],
    "async_lag1_tis": [*ASYNC, *THREAD],
    "async_lag1_tis_process": [*ASYNC, *PROCESS, *SPLIT_THREADS],
}
CURVE_WINDOW = 50
E2E_TITLES = {
    "arithmetic_grpo_smollm2": "SmolLM2 arithmetic GRPO",
    "default": "the default job (tiny model, arithmetic GRPO)",
}


# --- part 1: the update on a long-tailed batch -----------------------------------------------------------
def long_tail_batch(rows: int, vocab: int, max_response: int, seed: int) -> tuple[Batch, dict]:
    """Prompts of 40-70 tokens; response lengths log-normal (median 40) capped at ``max_response``."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(40, 71, (rows,), generator=g).tolist()
    r_lens = torch.exp(torch.randn(rows, generator=g) * 0.9 + torch.log(torch.tensor(40.0)))
    r_lens = r_lens.clamp(4, max_response).round().long().tolist()
    prompts = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in p_lens]
    responses = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in r_lens]
    t = pack_prompt_response(prompts, responses, None, pad_id=0)
    mask = t[F.LOSS_MASK]
    t[F.ADVANTAGES] = torch.randn(mask.shape, generator=g) * mask
    t[F.OLD_LOGPROBS] = (-torch.rand(mask.shape, generator=g) - 1.0) * mask
    batch = Batch(t, {F.UID: [str(i) for i in range(rows)], F.GROUP_ID: [i // 4 for i in range(rows)]})
    lengths = sorted(r_lens)
    real = int(real_lengths(batch).sum())
    stats = {
        "rows": rows,
        "width": batch.seq_len,
        "response_len_mean": round(statistics.fmean(lengths), 1),
        "response_len_p50": lengths[len(lengths) // 2],
        "response_len_p90": lengths[int(len(lengths) * 0.9)],
        "response_len_max": lengths[-1],
        "real_tokens": real,
        "padded_tokens": rows * batch.seq_len,
        "padding_frac": round(1 - real / (rows * batch.seq_len), 3),
    }
    return batch, stats


def _sync(device: str) -> None:
    """Wait for queued GPU work, so a wall-clock time covers the kernels it launched."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_update(
    model: str, rows: int, max_response: int, budget: int, reps: int, device: str, overrides: list[str]
) -> dict:
    path = resolve_model_path(model, load_config([]).model.tiny)
    policies = {
        name: HFPolicy(
            path,
            load_config(["algorithm.micro_batch_size=8", *overrides, *[o.format(budget=budget) for o in ov]]),
            device=device,
        )
        for name, ov in UPDATE_CASES.items()
    }
    vocab = next(iter(policies.values())).model.config.vocab_size
    batch, stats = long_tail_batch(rows, vocab, max_response, seed=0)
    n_tok = float(batch[F.LOSS_MASK].sum())
    times: dict[str, list[float]] = {name: [] for name in policies}
    micro = {name: len(p.micro_batches(batch)) for name, p in policies.items()}
    for rep in range(reps + 1):  # rep 0 warms up (allocator, first-call overheads): not counted
        for name, policy in policies.items():
            policy.model.zero_grad(set_to_none=True)
            _sync(device)
            start = time.perf_counter()
            policy.accumulate_gradients(batch, num_tokens=n_tok, norm_length=max_response)
            _sync(device)
            seconds = time.perf_counter() - start
            if rep:
                times[name].append(seconds)
            print(f"  update {name}: {seconds:.2f} s", flush=True)
    base = statistics.median(times["padded"])
    cases = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        cases[name] = {
            "median_s": round(med, 3),
            "times_s": [round(t, 3) for t in ts],
            "micro_batches": micro[name],
            "tokens_per_s": round(stats["real_tokens"] / med, 1),
            "speedup_vs_padded": round(base / med, 2),
        }
    return {"model": model, "budget": budget, "device": device, "batch": stats, "cases": cases}


# --- parts 2 and 3: the trainer ----------------------------------------------------------------------
def train_run(out: Path, overrides: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    wall = run(
        [*nemo_azr(), "train", *overrides, f"trainer.output_dir={out}", "logger=quiet"], out / "train.log"
    )
    records = read_jsonl(out / "metrics.jsonl")
    steps = [r["timing/step_s"] for r in records[1:] if "timing/step_s" in r]
    lags = [r.get("async/policy_lag", 0.0) for r in records]
    return {
        "steps": len(records),
        "wall_s": round(wall, 1),
        "step_s_median": round(statistics.median(steps), 3) if steps else None,
        "steps_per_s": round(1 / statistics.median(steps), 4) if steps else None,
        "rollout_s_median": round(statistics.median(r["timing/rollout_s"] for r in records[1:]), 3),
        "update_s_median": round(statistics.median(r["timing/update_s"] for r in records[1:]), 3),
        "wait_s_median": round(statistics.median(r.get("async/wait_s", 0.0) for r in records[1:]), 3),
        "policy_lag_max": max(lags),
        "is_weight_mean": round(
            statistics.fmean(r.get("off_policy/is_weight_mean", 1.0) for r in records), 4
        ),
        "is_clipped_frac_mean": round(
            statistics.fmean(r.get("off_policy/clipped_frac", 0.0) for r in records), 4
        ),
        "rewards": [round(r["reward/mean"], 4) for r in records],
    }


def bench_e2e(
    root: Path, steps: int, cases: list[str], overrides: list[str], budget: int, experiment: str
) -> dict:
    base = [
        *([f"experiment={experiment}"] if experiment != "default" else []),
        "logger.console_samples=false",
        f"trainer.max_steps={steps}",
        *overrides,
    ]
    cases = ["padded_sync", *[c for c in cases if c != "padded_sync"]]  # the reference runs first
    results = {}
    for name in cases:
        try:
            overrides = [*base, *(o.format(budget=budget) for o in E2E_CASES[name])]
            results[name] = train_run(root / "e2e" / name, overrides)
            print(json.dumps({name: results[name]}), flush=True)  # kept in the log if a later case hangs
        except SystemExit as exc:  # one failed case (its log tail kept) must not lose the others
            print(exc, flush=True)
            results[name] = {"error": str(exc)[-1500:]}
    ref = results["padded_sync"].get("step_s_median")
    for res in results.values():
        if ref and res.get("step_s_median"):
            res["speedup_vs_padded_sync"] = round(ref / res["step_s_median"], 2)
    return results


def bench_curve(
    root: Path,
    seeds: list[int],
    *,
    cases: list[str],
    experiment: str = "default",
    window: int = CURVE_WINDOW,
    overrides: list[str] = (),
    on_run: Callable[[dict], None] | None = None,
) -> dict:
    """Each case once per seed (seed by seed, so a cut-short run still compares the cases); the
    reward of the first / last ``window`` steps, mean and spread over seeds. ``on_run`` gets the
    summary so far after every run."""
    base = [*([f"experiment={experiment}"] if experiment != "default" else []), *overrides]
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    results: dict = {}
    for seed in seeds:
        for name in cases:
            ov = [*base, "logger.console_samples=false", *CURVE_CASES[name], f"seed={seed}"]
            runs[name].append(train_run(root / "curve" / f"{name}_seed{seed}", ov))
            results = {n: _curve_summary(r, seeds[: len(r)], window) for n, r in runs.items() if r}
            if on_run is not None:
                on_run(results)
    return results


def _curve_summary(runs: list[dict], seeds: list[int], window: int) -> dict:
    first = [statistics.fmean(r["rewards"][:window]) for r in runs]
    last = [statistics.fmean(r["rewards"][-window:]) for r in runs]
    return {
        "seeds": seeds,
        "steps": runs[0]["steps"],
        "reward_first": round(statistics.fmean(first), 4),
        "reward_last": round(statistics.fmean(last), 4),
        "reward_last_per_seed": [round(x, 4) for x in last],
        "reward_last_seed_std": round(statistics.pstdev(last), 4) if len(last) > 1 else None,
        "step_s_median": round(statistics.median(r["step_s_median"] for r in runs), 4),
        "wall_s_mean": round(statistics.fmean(r["wall_s"] for r in runs), 1),
        "is_weight_mean": round(statistics.fmean(r["is_weight_mean"] for r in runs), 4),
        "is_clipped_frac_mean": round(statistics.fmean(r["is_clipped_frac_mean"] for r in runs), 4),
        "policy_lag_max": max(r["policy_lag_max"] for r in runs),
    }


# --- report -------------------------------------------------------------------------------------------
def write_report(out: dict, name: str) -> None:
    meta = out["meta"]
    accel = f"GPU: {meta['gpu']}" if meta.get("gpu") else "CPU only"
    lines = [
        "# Throughput: packing, token-budget micro-batches, async rollout",
        "",
        f"Machine: {meta['cpu']}, {meta['cores']} cores, {meta['mem_gib']:.0f} GiB, {accel} (torch "
        f"{meta['torch']}); run {meta['date']}.  ",
        f"Command: `python benchmarks/throughput.py {meta['args']}`. Ratios are measured side by "
        "side in this one run; absolute times are this machine's.",
        *([f"Note: {meta['note']}."] if meta.get("note") else []),
        "",
    ]
    if "update" in out:
        u = out["update"]
        b = u["batch"]
        lines += [
            f"## Training forward/backward of one batch ({u['model']}, {u.get('device', 'cpu')})",
            "",
            f"{b['rows']} rows, prompts 40-70 tokens, response lengths log-normal: mean {b['response_len_mean']}, "
            f"p50 {b['response_len_p50']}, p90 {b['response_len_p90']}, max {b['response_len_max']}; "
            f"{b['real_tokens']} real tokens in a {b['rows']} x {b['width']} batch ({b['padding_frac']:.0%} "
            f"padding). Token budget {u['budget']}; `padded` is the default (8 rows per micro-batch, full width).",
            "",
            "| case | micro-batches | median s | training tokens/s | speed-up vs padded |",
            "| --- | --- | --- | --- | --- |",
            *[
                f"| {n} | {c['micro_batches']} | {c['median_s']} | {c['tokens_per_s']} | {c['speedup_vs_padded']}x |"
                for n, c in u["cases"].items()
            ],
            "",
        ]
    if "e2e" in out:
        lines += [
            f"## End to end: {E2E_TITLES.get(meta.get('e2e_experiment', ''), meta.get('e2e_experiment'))}",
            "",
            *([f"Overrides: `{' '.join(meta['e2e_overrides'])}`.", ""] if meta.get("e2e_overrides") else []),
            "| case | steps | median step s | steps/s | speed-up | rollout s | update s | trainer waits s | max lag |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *[
                f"| {n} | {r['steps']} | {r['step_s_median']} | {r['steps_per_s']} | {r['speedup_vs_padded_sync']}x | "
                f"{r['rollout_s_median']} | {r['update_s_median']} | {r['wait_s_median']} | {r['policy_lag_max']:.0f} |"
                for n, r in out["e2e"].items()
                if "speedup_vs_padded_sync" in r
            ],
            *[
                f"- {n} failed: `{r['error'].splitlines()[-1]}`"
                for n, r in out["e2e"].items()
                if "error" in r
            ],
            "",
        ]
    if "curve" in out:
        experiment = meta.get("curve_experiment", "default")
        lines += [
            f"## Learning: {E2E_TITLES.get(experiment, experiment)}, sync vs async lag 1 + TIS (training "
            f"reward, mean of the first / last {meta.get('curve_window', CURVE_WINDOW)} steps, averaged over seeds)",
            "",
            *(
                [f"Overrides: `{' '.join(meta['curve_overrides'])}`.", ""]
                if meta.get("curve_overrides")
                else []
            ),
            "| case | seeds | steps | reward first | reward last | last, per seed | std over seeds | median step s "
            "| IS weight mean | clipped frac | max lag |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *[
                f"| {n} | {len(r['seeds'])} | {r['steps']} | {r['reward_first']} | {r['reward_last']} | "
                f"{', '.join(str(x) for x in r['reward_last_per_seed'])} | {r['reward_last_seed_std']} | "
                f"{r['step_s_median']} | {r['is_weight_mean']} | {r['is_clipped_frac_mean']} | {r['policy_lag_max']:.0f} |"
                for n, r in out["curve"].items()
            ],
            "",
        ]
    (RESULTS_DIR / f"{name}.md").write_text("\n".join(lines))
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--parts", nargs="+", default=["update", "e2e", "curve"], choices=["update", "e2e", "curve"]
    )
    parser.add_argument(
        "--model", default="smollm2-135m", help="update part: a model preset, folder or 'tiny'"
    )
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-response", type=int, default=256)
    parser.add_argument("--budget", type=int, default=1024, help="tokens per micro-batch (budget cases)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--e2e-steps", type=int, default=6)
    parser.add_argument("--curve-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--curve-cases", nargs="+", default=list(CURVE_CASES), choices=list(CURVE_CASES))
    parser.add_argument(
        "--curve-experiment", default="default", help="curve part: the experiment trained (its own max_steps)"
    )
    parser.add_argument("--curve-window", type=int, default=CURVE_WINDOW, help="curve part: steps averaged")
    parser.add_argument("--curve-overrides", nargs="*", default=[], help="config overrides, curve part")
    parser.add_argument("--output-root", default="outputs/throughput")
    parser.add_argument("--device", default="cpu", help="update part: cpu or cuda")
    parser.add_argument("--update-overrides", nargs="*", default=[], help="config overrides, update part")
    parser.add_argument(
        "--e2e-overrides", nargs="*", default=[], help="config overrides, e2e part (e.g. trainer.device=cuda)"
    )
    parser.add_argument(
        "--e2e-cases",
        nargs="+",
        default=[
            c for c in E2E_CASES if c not in ("packed_async", "packed_async_process", "padded_sync_dynamic")
        ],  # CPU set
        choices=list(E2E_CASES),
    )
    parser.add_argument(
        "--e2e-budget", type=int, default=1024, help="tokens per micro-batch, packed e2e cases"
    )
    parser.add_argument(
        "--e2e-experiment",
        default="arithmetic_grpo_smollm2",
        help="e2e part: the experiment trained ('default': the default job, tiny model)",
    )
    parser.add_argument("--results-name", default="throughput", help="benchmarks/results/<name>.{md,json}")
    args = parser.parse_args()
    name = args.results_name
    root = Path(args.output_root)
    out: dict = {
        "meta": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "mem_gib": mem_total_gib(),
            "torch": torch.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "args": " ".join(sys.argv[1:]),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "e2e_overrides": args.e2e_overrides,
            "e2e_experiment": args.e2e_experiment,
            "curve_experiment": args.curve_experiment,
            "curve_window": args.curve_window,
            "curve_overrides": args.curve_overrides,
        }
    }
    if "update" in args.parts:
        out["update"] = bench_update(
            args.model,
            args.rows,
            args.max_response,
            args.budget,
            args.reps,
            args.device,
            args.update_overrides,
        )
        write_report(out, name)
    if "e2e" in args.parts:
        out["e2e"] = bench_e2e(
            root, args.e2e_steps, args.e2e_cases, args.e2e_overrides, args.e2e_budget, args.e2e_experiment
        )
        write_report(out, name)
    if "curve" in args.parts:

        def report(results: dict) -> None:
            out["curve"] = results
            write_report(out, name)

        bench_curve(
            root,
            args.curve_seeds,
            cases=args.curve_cases,
            experiment=args.curve_experiment,
            window=args.curve_window,
            overrides=args.curve_overrides,
            on_run=report,  # the report is rewritten after every run
        )
    print((RESULTS_DIR / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
