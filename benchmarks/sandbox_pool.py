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

A second part (``--part limits``; results ``sandbox_pool_limits.{json,md}``) runs one fixed batch of programs that hit their limits (CPU loops, sleepers, quick
prints: what makes a real model's step slow, and what the tiny model's programs rarely do) through
``map_ordered(run_python, ...)`` with the bound at 1 and at its default, also side by side, and
checks that every program's status and output are the same.

    .venv/bin/python benchmarks/sandbox_pool.py                 # 12 steps each
    .venv/bin/python benchmarks/sandbox_pool.py --steps 6
    .venv/bin/python benchmarks/sandbox_pool.py --part limits   # the second part alone

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
    steps = [r for r in rows if r["step"] > 1]  # step 1 carries start-up costs
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


#: The fixed batch of the second part: two CPU loops (end at the 2 s CPU limit), two sleepers (end at
#: the 5 s wall limit), four quick programs.
LIMIT_PROGRAMS = [
    "while True:\n    pass",
    "print(sum(i * i for i in range(10**5)))",
    "import time\ntime.sleep(30)",
    "print('a' * 3)",
    "x = 0\nwhile True:\n    x += 1",
    "print(len(str(2 ** 1000)))",
    "import time\ntime.sleep(30)",
    "print(sorted([3, 1, 2]))",
]


def limit_programs_case(workers: int) -> dict:
    from nemo_azr.envs.python_exec.pool import LIMITER, map_ordered
    from nemo_azr.envs.python_exec.sandbox import run_python

    LIMITER.configure(workers)
    start = time.perf_counter()
    results = map_ordered(run_python, LIMIT_PROGRAMS)
    wall = time.perf_counter() - start
    LIMITER.configure(0)
    return {
        "max_concurrent_runs": workers,
        "wall_s": wall,
        "outcomes": [(r.status, r.stdout) for r in results],
    }


def limits_part(args) -> None:
    print(
        f"programs at their limits: {len(LIMIT_PROGRAMS)} programs, one at a time and pooled ...", flush=True
    )
    seq, pool = limit_programs_case(1), limit_programs_case(0)
    summary = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "programs": LIMIT_PROGRAMS,
        "statuses": [status for status, _ in seq["outcomes"]],
        "sequential_s": seq["wall_s"],
        "pool_s": pool["wall_s"],
        "pool_workers": pool["max_concurrent_runs"] or os.cpu_count(),
        "differing_outcomes": sum(a != b for a, b in zip(seq["outcomes"], pool["outcomes"])),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}_limits.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# Sandbox pool: programs at their limits, concurrent vs one at a time",
        "",
        f"Machine: {summary['machine']}; {summary['date']}; `benchmarks/sandbox_pool.py --part limits`. "
        f"One batch of {len(LIMIT_PROGRAMS)} programs (statuses: {', '.join(summary['statuses'])}) through "
        "`map_ordered(run_python, ...)` with the default limits (2 s CPU, 5 s wall), both cases in one "
        "invocation:",
        "",
        "| case | wall s |",
        "| --- | --- |",
        f"| one at a time (bound 1) | {summary['sequential_s']:.2f} |",
        f"| pooled (bound {summary['pool_workers']}, the default: one per core) | {summary['pool_s']:.2f} |",
        "",
        f"Sequential / pool: {summary['sequential_s'] / summary['pool_s']:.2f}; programs whose status or "
        f"output differ: {summary['differing_outcomes']}.",
        "",
    ]
    (RESULTS / f"{args.results_name}_limits.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overrides", nargs="*", default=[])
    parser.add_argument("--results-name", default="sandbox_pool")
    parser.add_argument("--part", choices=("steps", "limits", "both"), default="both")
    args = parser.parse_args()
    if args.part in ("steps", "both"):
        steps_part(args)
    if args.part in ("limits", "both"):
        limits_part(args)


def steps_part(args) -> None:
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
        f"Sequential / pool: step time {summary['speedup_step']:.2f}, sandbox time "
        f"{summary['speedup_sandbox']:.2f} (above 1: the pool is faster). Sample rows compared (prompt, response, reward): "
        f"{summary['sample_rows']} (the first row of every group of every step), differing: "
        f"{summary['differing_rows']}; steps whose mean reward or learnable count differ: {summary['differing_steps']}.",
        "",
    ]
    (RESULTS / f"{args.results_name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
