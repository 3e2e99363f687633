"""Re-score a held-out self-play evaluation's solver episodes under the current ``sandbox_os`` rule.

    python benchmarks/selfplay_rescore.py "step_0=outputs/RUN/eval_step_0" "step_40=outputs/RUN/eval_step_40"

Each episode's executed actions (``samples.jsonl``, ``part: solver``) are replayed in a fresh
episode of its held-out task, so an evaluation written before a change of the harm rule (decision
216's near misses) reads on the rule of today without generating again. Prints, per evaluation, the
harm reward and safety as written and as re-scored, and the tasks whose safety changed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import AbsoluteZeroConfig
from nemo_azr.envs.sandbox_os import SandboxOSEnv
from nemo_azr.envs.sandbox_os.heldout import load_heldout
from nemo_azr.selfplay.learnability import harm_reward


def heldout_tasks() -> dict[str, dict[str, Any]]:
    return {task["task_id"]: task for task in load_heldout()[1]}


def replay_safety(task: dict[str, Any], actions: Sequence[str]) -> tuple[float, list[str]]:
    """(safety, rule harms) of the recorded actions replayed one by one in a fresh episode."""
    env = SandboxOSEnv()
    env.reset(task)
    for line in actions:
        if env.step(line).done:
            break
    result = env.evaluate()
    return result.safety_score, result.info["rule_harms"]


def rescore(eval_dir: Path, tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Written and re-scored means over the evaluation's solver episodes (the seeds' 0.7 / 0.3 weights)."""
    rows = [
        json.loads(line) for line in (eval_dir / "samples.jsonl").read_text().splitlines() if line.strip()
    ]
    solver = [r for r in rows if r.get("part") == "solver"]
    if not solver:
        raise SystemExit(f"{eval_dir}: no solver episodes in samples.jsonl")
    changed, safety_now = [], []
    for row in solver:
        safety, harms = replay_safety(tasks[row["task_id"]], row["actions"])
        safety_now.append(safety)
        if safety != row["safety"]:
            changed.append(f"{row['task_id']}: {row['safety']:.0f} -> {safety:.0f} ({'; '.join(harms)})")
    n = len(solver)
    completion = sum(r["completion"] for r in solver) / n
    return {
        "tasks": n,
        "safety_written": sum(r["safety"] for r in solver) / n,
        "safety_now": sum(safety_now) / n,
        "harm_reward_written": sum(r["harm_reward"] for r in solver) / n,
        "harm_reward_now": harm_reward(sum(safety_now) / n, completion, AbsoluteZeroConfig()),
        "changed": changed,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("evals", nargs="+", help="label=eval_dir")
    tasks = heldout_tasks()
    print("| evaluation | harm reward written | re-scored | safety written | re-scored | tasks changed |")
    print("| --- | --- | --- | --- | --- | --- |")
    details = []
    for item in parser.parse_args(argv).evals:
        label, _, path = item.partition("=")
        out = rescore(Path(path), tasks)
        print(
            f"| {label} | {out['harm_reward_written']:.3f} | {out['harm_reward_now']:.3f} | "
            f"{out['safety_written']:.3f} | {out['safety_now']:.3f} | {len(out['changed'])} |"
        )
        details += [f"{label}: {line}" for line in out["changed"]]
    print("\n".join(["", *details]) if details else "")


if __name__ == "__main__":
    main()
