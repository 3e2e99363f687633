"""How far a ``data.curriculum=feedback`` run's seed draws have narrowed, read from its checkpoints.

    python benchmarks/curriculum_state.py outputs/RUN/checkpoints/step_8 outputs/RUN/checkpoints/step_40

Prints one markdown row per checkpoint: the draws so far, how many prompts still sit at the
optimistic 1.0 (untried, or every group of theirs in the band), how many fell below 0.3, and the
effective number of prompts the next draw spreads over (``1 / sum(p_i^2)`` of the loader's draw weights,
``floor + usefulness`` or by rank with ``data.curriculum_rank_temperature``; the prompt count when the
draws are uniform). The curriculum's state lives in
``trainer_state.json`` under ``loader`` (``nemo_azr.tasks.dataloader.FeedbackCurriculumLoader``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import yaml

from nemo_azr.tasks.dataloader import curriculum_weights


def curriculum_row(
    usefulness: Mapping[str, float], floor: float, rank_temperature: float = 0.0
) -> dict[str, float]:
    """Summary of one usefulness table under the curriculum's draw weights."""
    weights = curriculum_weights(torch.tensor(list(usefulness.values())), floor, rank_temperature).tolist()
    total = sum(weights)
    return {
        "prompts": len(usefulness),
        "at 1.0": sum(1 for u in usefulness.values() if u >= 1.0),
        "below 0.3": sum(1 for u in usefulness.values() if u < 0.3),
        "mean usefulness": sum(usefulness.values()) / len(usefulness),
        "effective prompts": 1.0 / sum((w / total) ** 2 for w in weights),
    }


def read_checkpoint(path: Path) -> tuple[int, int, dict[str, float], float, float]:
    """(step, draws, usefulness, floor, rank temperature) of a checkpoint saved with the feedback
    curriculum (the defaults 0.1 and 0 where its config.yaml does not say)."""
    state = json.loads((path / "trainer_state.json").read_text())
    loader = state.get("loader", {})
    if "usefulness" not in loader:
        raise SystemExit(f"{path}: no curriculum state (was the run trained with data.curriculum=feedback?)")
    config_path = path / "config.yaml"
    data = (yaml.safe_load(config_path.read_text()) or {}).get("data", {}) if config_path.exists() else {}
    floor = float(data.get("curriculum_floor", 0.1))
    temperature = float(data.get("curriculum_rank_temperature", 0.0))
    return int(state["step"]), int(loader.get("draws", 0)), dict(loader["usefulness"]), floor, temperature


def table(paths: Sequence[Path]) -> str:
    columns = ("prompts", "at 1.0", "below 0.3", "mean usefulness", "effective prompts")
    lines = ["| step | draws | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 2)]
    for path in paths:
        step, draws, usefulness, floor, temperature = read_checkpoint(path)
        row = curriculum_row(usefulness, floor, temperature)
        cells = [f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        lines.append(f"| {step} | {draws} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    print(table(parser.parse_args(argv).checkpoints))


if __name__ == "__main__":
    main()
