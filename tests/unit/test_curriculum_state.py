"""benchmarks/curriculum_state.py: the narrowing of a feedback curriculum, read from a checkpoint."""

import json
import sys
from pathlib import Path

import pytest

from nemo_azr.contracts.task import Example
from nemo_azr.tasks.dataloader import FeedbackCurriculumLoader

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import curriculum_state  # noqa: E402


def test_effective_prompts_by_hand():
    # weights 1.1 and 0.1: p = 11/12, 1/12; 1 / sum(p^2) = 144 / 122
    row = curriculum_state.curriculum_row({"a": 1.0, "b": 0.0}, floor=0.1)
    assert row["effective prompts"] == pytest.approx(144 / 122)
    assert (row["at 1.0"], row["below 0.3"], row["mean usefulness"]) == (1, 1, 0.5)
    uniform = curriculum_state.curriculum_row({str(i): 0.4 for i in range(7)}, floor=0.1)
    assert uniform["effective prompts"] == pytest.approx(7.0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_table_reads_the_loaders_saved_state(tmp_path, temperature):
    examples = [Example(prompt_id=f"p{i}", question=str(i), answer=str(i)) for i in range(4)]
    loader = FeedbackCurriculumLoader(examples, 2, seed=0, floor=0.1, decay=0.5, rank_temperature=temperature)
    loader.record({"p0": 0.0, "p1": 0.0})
    loader.record({"p0": 0.0, "p1": 0.0})  # 1.0 -> 0.5 -> 0.25 at decay 0.5
    loader.draws = 3
    checkpoint = tmp_path / "step_3"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 3, "loader": loader.state_dict()}))
    (checkpoint / "config.yaml").write_text(
        f"data:\n  curriculum_floor: 0.1\n  curriculum_rank_temperature: {temperature}\n"
    )
    weights = loader.weights()
    p = weights / weights.sum()
    expected = 1.0 / float((p**2).sum())
    lines = curriculum_state.table([checkpoint]).splitlines()
    assert lines[2] == f"| 3 | 3 | 4 | 2 | 2 | 0.625 | {expected:.3f} |"


def test_a_checkpoint_without_a_curriculum_is_named(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 0, "loader": {"epoch": 0}}))
    with pytest.raises(SystemExit, match="no curriculum state"):
        curriculum_state.read_checkpoint(tmp_path)
