"""Sample logging picks rows of every kind (answers and confidences, proposer and solver)."""

from __future__ import annotations

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.trainer.samples import format_samples, select_samples


def _batch(kinds: list[tuple[str, str, str]]) -> Batch:
    """Rows of (group, role, sample_type); response text = the row index."""
    n = len(kinds)
    tensors = {F.REWARDS: torch.arange(n, dtype=torch.float32) / 10}
    meta = {
        F.GROUP_ID: [g for g, _, _ in kinds],
        F.ROLE: [r for _, r, _ in kinds],
        F.SAMPLE_TYPE: [t for _, _, t in kinds],
        F.PROMPT_TEXT: [f"q{g}" for g, _, _ in kinds],
        F.RESPONSE_TEXT: [str(i) for i in range(n)],
        "confidence": [0.5] * n,
    }
    return Batch(tensors, meta)


def test_first_row_of_distinct_groups_taken_in_turn_from_each_kind():
    # RLCR two-turn layout: 3 prompts x 2 answers, then their confidence rows
    rows = [(g, "solver", "answer") for g in "abc" for _ in range(2)]
    rows += [(g, "solver", "confidence") for g in "abc" for _ in range(2)]
    picked = select_samples(_batch(rows), 4, step=7)
    # answers of a and b, confidences of a and b, in row order
    assert [r["response"] for r in picked] == ["0", "2", "6", "8"]
    assert [r["sample_type"] for r in picked] == ["answer", "answer", "confidence", "confidence"]
    assert picked[0] == {
        "step": 7, "group_id": "a", "prompt": "qa", "response": "0", "reward": 0.0,
        "role": "solver", "sample_type": "answer", "confidence": 0.5,
    }  # fmt: skip
    assert picked[1]["reward"] == torch.tensor(0.2).item()


def test_fewer_rows_than_asked_and_off():
    rows = [("a", "proposer", "answer"), ("b", "solver", "answer"), ("b", "solver", "answer")]
    assert [r["response"] for r in select_samples(_batch(rows), 10, step=0)] == ["0", "1"]
    assert select_samples(_batch(rows), 0, step=0) == []
    assert select_samples(Batch(), 4, step=0) == []


def test_console_format_is_one_line_per_field_and_cut():
    text = format_samples([{"prompt": "What?\nx", "response": "y" * 1000, "reward": 1.0}])
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0] == "  [reward 1] What?\\nx" and lines[1].endswith("...")
