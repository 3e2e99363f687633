"""benchmarks/union_pairs.py: two sampling rounds joined into one pair file train-rm can read."""

import sys
from pathlib import Path

import pytest

from nemo_azr.tasks.preference_data import PreferencePair, load_pairs_jsonl, write_pairs_jsonl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import union_pairs  # noqa: E402


def test_rounds_over_one_problem_set_join_under_tagged_ids(tmp_path):
    first = [PreferencePair("arith-1+2", "What is 1 + 2?", "1 + 2 = 3", "1 + 2 = 4")]
    second = [
        PreferencePair("arith-1+2", "What is 1 + 2?", "1 + 2 is 3.", "1 + 2 is 5."),
        PreferencePair("arith-3+4", "What is 3 + 4?", "3 + 4 is 7.", "3 + 4 is 8."),
    ]
    write_pairs_jsonl(first, tmp_path / "a.jsonl")
    write_pairs_jsonl(second, tmp_path / "b.jsonl")
    joined = union_pairs.union([("r1", tmp_path / "a.jsonl"), ("r2", tmp_path / "b.jsonl")])
    assert [p.id for p in joined] == ["r1-arith-1+2", "r2-arith-1+2", "r2-arith-3+4"]
    assert [p.rejected for p in joined] == ["1 + 2 = 4", "1 + 2 is 5.", "3 + 4 is 8."]
    write_pairs_jsonl(joined, tmp_path / "u.jsonl")
    assert load_pairs_jsonl(tmp_path / "u.jsonl") == joined  # the repeated problem no longer clashes
    with pytest.raises(SystemExit, match="own tag"):
        union_pairs.union([("r1", tmp_path / "a.jsonl"), ("r1", tmp_path / "b.jsonl")])
