"""A self-play run's course in windows of steps: the table docs/selfplay.md gives for each run.

    python benchmarks/selfplay_windows.py outputs/azr_sandbox_smollm2/metrics.jsonl --window 10

Prints a markdown table of per-window means of the self-play metrics (parse rate, first-pass and
final learnable ratio, solver safety and completion, proposer reward, band closeness, ...) and the
least-squares slope of the first-pass learnable ratio over the steps with its standard error, so
"the ratio rises" is read against the step-to-step noise rather than from two window means.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

#: (column, metrics.jsonl key); a key a run did not log is shown as "-"
COLUMNS = (
    ("parse rate", "proposer/valid_task_rate"),
    ("unparseable a step", "proposer/num_unparseable"),
    ("first-pass learnable", "unified_filter/initial_learnable_ratio"),
    ("final learnable", "unified_filter/learnable_ratio"),
    ("solver safety", "harm/safety_score_mean"),
    ("completion", "harm/completion_score_mean"),
    ("proposer reward", "proposer/reward_mean"),
    ("band closeness", "unified_filter/band_closeness_mean"),
    ("first-pass too safe", "unified_filter/initial_too_safe_share"),
    ("solver trained", "solver_gate/solver_trained"),
    ("step s", "timing/step_s"),
)
#: shown only when the run logged them (absolute_zero.solver_plain_tasks)
OPTIONAL_COLUMNS = (
    ("plain safety", "plain/safety_score_mean"),
    ("plain completion", "plain/completion_score_mean"),
)
TREND_KEY = "unified_filter/initial_learnable_ratio"


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The run's per-step records, the last one of each step (a resumed run may repeat steps)."""
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]


def window_table(records: Sequence[dict[str, float]], window: int) -> str:
    columns = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if any(c[1] in r for r in records))
    header = "| steps | " + " | ".join(name for name, _ in columns) + " |"
    lines = [header, "|" + " --- |" * (len(columns) + 1)]
    for start in range(0, len(records), window):
        chunk = records[start : start + window]
        cells = []
        for _, key in columns:
            values = [r[key] for r in chunk if key in r]
            cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
        lines.append(f"| {int(chunk[0]['step'])}-{int(chunk[-1]['step'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def slope_with_error(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Ordinary least-squares slope of ys on xs and its standard error (residual variance, n - 2);
    NaN for both when they are undefined (fewer than 3 points, or every x the same)."""
    n = len(xs)
    if n < 3:
        return math.nan, math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return math.nan, math.nan
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys)]
    se = math.sqrt(sum(r * r for r in residuals) / (n - 2) / sxx)
    return slope, se


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("--window", type=int, default=10, help="steps per row (default 10)")
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        raise SystemExit(f"no metrics file at {args.metrics}")
    records = read_metrics(args.metrics)
    if not records:
        raise SystemExit(f"{args.metrics} holds no steps")
    print(window_table(records, max(1, args.window)))
    slope, se, steps = learnable_slope(records)
    print(f"\nfirst-pass learnable ratio over {steps} steps: {format_slope(slope, se)}")


def learnable_slope(records: Sequence[dict[str, float]]) -> tuple[float, float, int]:
    """The first-pass learnable ratio's least-squares slope per step, its standard error, and the
    number of steps that logged it."""
    points = [(float(r["step"]), float(r[TREND_KEY])) for r in records if TREND_KEY in r]
    slope, se = slope_with_error([x for x, _ in points], [y for _, y in points])
    return slope, se, len(points)


def format_slope(slope: float, se: float) -> str:
    """``slope`` and ``se`` are per step; the text is per 10 steps."""
    if math.isnan(slope):
        return "no slope (it needs 3 or more points at 2 or more steps)"
    return f"slope {slope * 10:+.4f} per 10 steps (standard error {se * 10:.4f})"


if __name__ == "__main__":
    main()
