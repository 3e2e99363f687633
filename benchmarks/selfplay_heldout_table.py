"""Held-out self-play evaluations side by side: the tables docs/selfplay.md gives for each run.

    python benchmarks/selfplay_heldout_table.py "step 0=outputs/RUN/eval_step_0" "step 32=outputs/RUN/eval_step_32"

Each argument is ``LABEL=DIR``, an output folder of ``nemo-azr eval experiment=azr_sandbox_smollm2``
(its ``metrics.json`` and ``samples.jsonl``). Prints three markdown tables: the headline row of each
evaluation (harm reward, safety, completion, refusals, the proposer's parse rate and first-pass
learnable ratio), completion / safety by goal family (``solver.by_goal_verb``), and each evaluation's
gain over the first one with its paired standard error. The held-out tasks are the same 120 in every
evaluation and the solver is greedy, so a gain is read task by task: the standard error of the mean of
the per-task differences, which is smaller than the two means' independent errors when the same tasks
stay hard or easy (a task not in both evaluations is left out of the pairing and counted).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PAIRED_KEYS = ("harm_reward", "safety", "completion")


@dataclass(frozen=True)
class HeldOut:
    label: str
    metrics: dict
    solver_rows: dict[str, dict]  # task_id -> the solver episode's record


def load(label: str, folder: Path) -> HeldOut:
    metrics_file, samples_file = folder / "metrics.json", folder / "samples.jsonl"
    if not metrics_file.is_file():
        raise SystemExit(f"{folder}: no metrics.json (not a finished `nemo-azr eval` output folder)")
    rows: dict[str, dict] = {}
    if samples_file.is_file():
        for line in samples_file.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("part") == "solver":
                rows[str(record["task_id"])] = record
    return HeldOut(label, json.loads(metrics_file.read_text()), rows)


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def headline_table(evals: Sequence[HeldOut]) -> str:
    lines = [
        "| checkpoint | harm reward | safety | completion | refusals | proposer parse rate | first-pass learnable |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in evals:
        solver, proposer = e.metrics.get("solver") or {}, e.metrics.get("proposer") or {}
        refusals = solver.get("refusal_rate")
        lines.append(
            f"| {e.label} | {_cell(solver.get('harm_reward'))} | {_cell(solver.get('safety'))} | "
            f"{_cell(solver.get('completion'))} | "
            f"{'-' if refusals is None else f'{100 * refusals:.1f}%'} | "
            f"{_cell(proposer.get('parse_rate'))} | {_cell(proposer.get('first_pass_learnable_ratio'))} |"
        )
    return "\n".join(lines)


def family_table(evals: Sequence[HeldOut]) -> str:
    families: dict[str, int] = {}
    for e in evals:
        for verb, block in ((e.metrics.get("solver") or {}).get("by_goal_verb") or {}).items():
            families[verb] = max(families.get(verb, 0), int(block["num_tasks"]))
    names = sorted(families)
    lines = [
        "| checkpoint | " + " | ".join(f"{n} ({families[n]})" for n in names) + " |",
        "|" + " --- |" * (len(names) + 1),
    ]
    for e in evals:
        by_verb = (e.metrics.get("solver") or {}).get("by_goal_verb") or {}
        cells = [
            f"{by_verb[n]['completion']:.2f} / {by_verb[n]['safety']:.2f}" if n in by_verb else "-"
            for n in names
        ]
        lines.append(f"| {e.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_gain(base: dict[str, dict], other: dict[str, dict], key: str) -> tuple[float, float, int]:
    """Mean of ``other - base`` over the tasks both evaluated, its standard error, and the task count."""
    diffs = [float(other[t][key]) - float(base[t][key]) for t in sorted(base.keys() & other.keys())]
    n = len(diffs)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(diffs) / n
    if n == 1:
        return mean, math.nan, 1
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean, math.sqrt(variance / n), n


def gain_table(evals: Sequence[HeldOut]) -> str:
    base = evals[0]
    lines = [
        f"| against {base.label} | tasks paired | " + " | ".join(PAIRED_KEYS) + " |",
        "|" + " --- |" * (len(PAIRED_KEYS) + 2),
    ]
    for e in evals[1:]:
        cells, paired = [], 0
        for key in PAIRED_KEYS:
            mean, se, paired = paired_gain(base.solver_rows, e.solver_rows, key)
            cells.append("-" if paired == 0 else f"{mean:+.3f} ± {se:.3f}")
        lines.append(f"| {e.label} | {paired} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_pair(text: str) -> tuple[str, Path]:
    label, sep, folder = text.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"expected LABEL=DIR, got {text!r}")
    return label, Path(folder)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("evals", nargs="+", type=parse_pair, help="LABEL=DIR, the first is the baseline")
    args = parser.parse_args(argv)
    evals = [load(label, folder) for label, folder in args.evals]
    print(headline_table(evals), end="\n\n")
    print("Completion / safety by goal family (`solver.by_goal_verb`):\n")
    print(family_table(evals), end="\n\n")
    if len(evals) > 1:
        print("Gain over the first, task by task (mean ± paired standard error):\n")
        print(gain_table(evals))


if __name__ == "__main__":
    main()
