#!/usr/bin/env python
"""Self-play step time with the sandboxed programs run concurrently vs one at a time, side by side.

``nemo-azr train experiment=azr_code`` (tiny model, the experiment's warm-up, ``--steps`` self-play
steps, seed ``--seed``) twice in one invocation: ``sequential``
(``absolute_zero.python_exec.max_concurrent_runs=1``: a step's programs run one after another, the
behaviour before the pool) and ``pool`` (``0``: one per core). Per case: the median step time, the
median self-play rollout time and ``timing/sandbox_s`` (wall time with at least one sandbox
running), all measured on the same machine in the same invocation. The pool changes only when a
program runs, not its limits or result, so every sample row (prompt, response, reward) must be the
same in both runs; the script checks it row for row and reports the count of differing rows.

    .venv/bin/python benchmarks/sandbox_pool.py                 # 12 steps each
    .venv/bin/python benchmarks/sandbox_pool.py --steps 6

Results: benchmarks/results/sandbox_pool.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from machine import cpu_model  # noqa: E402

from nemo_azr.trainer.metrics import read_metrics  # noqa: E402

CASES = {"sequential": 1, "pool": 0}
RESULTS = ROOT / "benchmarks" / "results"


def run_case(name: str, workers: int, out: Path, args) -> dict:
    cmd = [
        sys.executable, "-m", "nemo_azr", "train", "experiment=azr_code",
        f"seed={args.seed}", f"trainer.max_steps={args.steps}", f"trainer.output_dir={out}",
        f"absolute_zero.python_exec.max_concurrent_runs={workers}",
        "logger=quiet", "logger.samples_per_step=100000", "trainer.save_interval=0",
        *args.overrides,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name}: nemo-azr train failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = read_metrics(out / "metrics.jsonl")
    steps = [r for r in rows if r["step"] > 0]  # step 0 carries start-up costs
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {
        "case": name,
        "max_concurrent_runs": workers,
        "steps": len(rows),
        "median_step_s": statistics.median(r["timing/step_s"] for r in steps),
        "median_rollout_s": statistics.median(r["timing/azr_rollout_s"] for r in steps),
        "median_sandbox_s": statistics.median(r["timing/sandbox_s"] for r in steps),
        "sandbox_share": sum(r["timing/sandbox_s"] for r in steps) / sum(r["timing/step_s"] for r in steps),
        "total_wall_s": wall,
        "samples": [(s["step"], s.get("prompt"), s.get("response"), s.get("reward")) for s in samples],
        "step_rewards": [
            (r["step"], r.get("reward/mean"), r.get("unified_filter/num_learnable")) for r in rows
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overrides", nargs="*", default=[])
    parser.add_argument("--results-name", default="sandbox_pool")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="sandbox_pool_") as tmp:
        for name, workers in CASES.items():
            print(f"{name}: {args.steps} steps ...", flush=True)
            results.append(run_case(name, workers, Path(tmp) / name, args))
    seq, pool = results
    differing = sum(a != b for a, b in zip(seq["samples"], pool["samples"])) + abs(
        len(seq["samples"]) - len(pool["samples"])
    )
    summary = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "steps": args.steps,
        "seed": args.seed,
        "overrides": args.overrides,
        "cases": [{k: v for k, v in r.items() if k not in ("samples", "step_rewards")} for r in results],
        "speedup_step": seq["median_step_s"] / pool["median_step_s"],
        "speedup_sandbox": seq["median_sandbox_s"] / pool["median_sandbox_s"],
        "sample_rows": len(seq["samples"]),
        "differing_rows": differing,
        "differing_steps": sum(a != b for a, b in zip(seq["step_rewards"], pool["step_rewards"])),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# Sandbox pool: azr_code step time, programs concurrent vs one at a time",
        "",
        f"Machine: {summary['machine']}; {summary['date']}; `benchmarks/sandbox_pool.py --steps {args.steps}` "
        f"(tiny model, `experiment=azr_code`, seed {args.seed}, both cases in one invocation; medians over "
        "steps 1.., step 0 left out).",
        "",
        "| case | max_concurrent_runs | step s | self-play rollout s | sandbox s | sandbox share of the step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary["cases"]:
        lines.append(
            f"| {r['case']} | {r['max_concurrent_runs']} | {r['median_step_s']:.2f} | {r['median_rollout_s']:.2f} "
            f"| {r['median_sandbox_s']:.2f} | {r['sandbox_share']:.0%} |"
        )
    lines += [
        "",
        f"Pool over sequential: step time {summary['speedup_step']:.2f}x faster, sandbox time "
        f"{summary['speedup_sandbox']:.2f}x. Sample rows compared (prompt, response, reward): "
        f"{summary['sample_rows']} (the first row of every group of every step), differing: "
        f"{summary['differing_rows']}; steps whose mean reward or learnable count differ: {summary['differing_steps']}.",
        "",
    ]
    (RESULTS / f"{args.results_name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
