#!/usr/bin/env python
"""What a reward model pays for: its scores of an evaluation's greedy replies, right against wrong.

A reward model trained on preference pairs is used as the RL reward (seed 004, class 4). Whether a
policy can game it shows in how it scores the replies a rule marks right and wrong: this script
re-scores every reply of one or more ``nemo-azr eval`` folders (``samples.jsonl``: question, reply,
the rule's reward) with the reward model, through the same chat-templated prompt the trainer gives
it (``task.messages``), and reports per folder the mean score of right and of wrong replies and the
AUROC of the score for the rule's verdict (0.5: the score does not tell them apart).

    .venv/bin/python benchmarks/reward_model_scores.py experiment=arithmetic_rm_smollm2 \\
        --eval outputs/real_model/arithmetic_rm_smollm2/eval_before \\
        --eval outputs/real_model/arithmetic_rm_smollm2/eval_after

Results: ``benchmarks/results/reward_model_scores.{json,md}`` (``--results-name`` picks another stem, as in the other benchmark scripts).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from machine import cpu_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def _unit_ranks(values: list[float]) -> list[float]:
    order = sorted(set(values))
    rank = {v: i / max(1, len(order) - 1) for i, v in enumerate(order)}
    return [rank[v] for v in values]


def score_folder(folder: Path, model, task) -> dict:
    from nemo_azr.rlcr.calibration import auroc

    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    by_id = {ex.prompt_id: ex for ex in task.examples}
    missing = [r["prompt_id"] for r in rows if r["prompt_id"] not in by_id]
    if missing:
        raise SystemExit(
            f"{folder}: {len(missing)} replies to prompts the task does not hold (e.g. {missing[0]})"
        )
    scores = model.score([task.messages(by_id[r["prompt_id"]]) for r in rows], [r["response"] for r in rows])
    right = [float(s) for s, r in zip(scores, rows, strict=True) if r["reward"] >= 1.0]
    wrong = [float(s) for s, r in zip(scores, rows, strict=True) if r["reward"] < 1.0]
    return {
        "folder": str(folder),
        "replies": len(rows),
        "right": len(right),
        "score_right_mean": statistics.fmean(right) if right else None,
        "score_wrong_mean": statistics.fmean(wrong) if wrong else None,
        # AUROC depends on the order of the scores only: their ranks scaled to [0, 1] (ties kept tied)
        "auroc": auroc(_unit_ranks([float(s) for s in scores]), [float(r["reward"] >= 1.0) for r in rows]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval", type=Path, action="append", required=True, help="a nemo-azr eval folder")
    parser.add_argument(
        "--label", action="append", default=[], help="a name per --eval folder (default: its name)"
    )
    parser.add_argument(
        "--results-name", default="reward_model_scores", help="results file stem under benchmarks/results"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides naming the experiment and reward model")
    args = parser.parse_args()
    from nemo_azr.preflight import load_config
    from nemo_azr.rewards.reward_model import RewardModel
    from nemo_azr.tasks import build_task

    cfg = load_config([*args.overrides, "preference.loss="])
    model = RewardModel(
        cfg.reward_model.path, dtype=cfg.reward_model.dtype, batch_size=cfg.reward_model.batch_size
    )
    task = build_task(cfg.data, "eval")
    labels = args.label + [folder.name for folder in args.eval[len(args.label) :]]
    rows = {label: score_folder(folder, model, task) for label, folder in zip(labels, args.eval, strict=True)}
    result = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "reward_model": cfg.reward_model.path,
        "overrides": args.overrides,
        "evals": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# What the reward model pays for: its scores of right and wrong greedy replies",
        "",
        f"Measured {result['date']} on {result['cpu']}; reward model `{result['reward_model']}`; overrides "
        f"`{' '.join(args.overrides)}`. Right and wrong are the task's rule verdicts; AUROC 0.5 means the "
        "score does not tell them apart (`benchmarks/reward_model_scores.py`).",
        "",
        "| replies | n | right | mean score, right | mean score, wrong | AUROC (score vs right) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def f(x) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    for label, r in rows.items():
        lines.append(f"| {label} | {r['replies']} | {r['right']} | {f(r['score_right_mean'])} | "
                     f"{f(r['score_wrong_mean'])} | {f(r['auroc'])} |")  # fmt: skip
    (RESULTS / f"{args.results_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
