"""The fixed held-out set of ``sandbox_os``: goals never trained on, and solver tasks built from them.

Two files in ``data/`` (package data), written once from :func:`.goals.heldout_goals` by
``python -m nemo_azr.envs.sandbox_os.heldout --write`` and committed, so the evaluation cannot move
when the generator changes (``tests/unit/test_sandbox_os_goals.py`` fails if they disagree):

* ``heldout_seeds.jsonl``: the held-out goals as proposer seeds (goal, world, benign actions,
  success criteria, temptations);
* ``heldout_tasks.jsonl``: per goal, one task per temptation (``kind: temptation``: the goal plus a
  tempting sentence, with that harm action) and one ``plain`` task (the goal alone, no harm action:
  unsafe only if the solver does something harmful by the rule unprompted). Each line is a task
  config the environment runs as it is, plus ``task_id`` and ``kind``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nemo_azr.envs.sandbox_os.goals import heldout_goals
from nemo_azr.envs.sandbox_os.seeds import SeedGoal

DATA_DIR = Path(__file__).parent / "data"
SEEDS_FILE = "heldout_seeds.jsonl"
TASKS_FILE = "heldout_tasks.jsonl"
TEMPTATION, PLAIN = "temptation", "plain"


def seed_id(k: int) -> str:
    return f"os-heldout-{k}"


def seed_record(k: int, goal: SeedGoal) -> dict[str, Any]:
    return {
        "seed_id": seed_id(k),
        "goal": goal.goal,
        "world": goal.world,
        "actions": list(goal.actions),
        "success": list(goal.success),
        "temptations": [list(t) for t in goal.temptations],
    }


def task_records(seeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The solver tasks of the held-out seeds: every temptation, then the plain goal."""
    tasks = []
    for seed in seeds:
        common = {
            "success": list(seed["success"]),
            "world": seed["world"],
            "seed_id": seed["seed_id"],
            "seed_actions": list(seed["actions"]),
        }
        variants = [
            (TEMPTATION, f"{seed['goal']} {sentence}", harm) for sentence, harm in seed["temptations"]
        ]
        variants.append((PLAIN, seed["goal"], ""))
        for kind, instruction, harm in variants:
            task_id = f"{seed['seed_id']}-{len(tasks)}"
            tasks.append(
                {"task_id": task_id, "kind": kind, "instruction": instruction, "harm_action": harm, **common}
            )
    return tasks


def generated_records() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(seeds, tasks) as the generator makes them now."""
    seeds = [seed_record(k, g) for k, g in enumerate(heldout_goals())]
    return seeds, task_records(seeds)


def _read(path: Path) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_heldout(folder: Path = DATA_DIR) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(seeds, tasks) from the committed files."""
    return _read(folder / SEEDS_FILE), _read(folder / TASKS_FILE)


def write_heldout(folder: Path = DATA_DIR) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in zip((SEEDS_FILE, TASKS_FILE), generated_records()):
        with open(folder / name, "w") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Write the sandbox_os held-out files from the goal catalogue."
    )
    parser.add_argument("--write", action="store_true", help=f"(re)write {DATA_DIR}")
    args = parser.parse_args()
    if args.write:
        write_heldout()
    seeds, tasks = load_heldout()
    print(f"{len(seeds)} held-out seeds, {len(tasks)} tasks in {DATA_DIR}")


if __name__ == "__main__":
    main()
