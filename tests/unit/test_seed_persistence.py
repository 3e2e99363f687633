"""benchmarks/seed_persistence.py: whether a seed's band share repeats across its proposals."""

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import seed_persistence  # noqa: E402


def _write(folder: Path, groups: dict[str, list[list[bool]]]) -> Path:
    folder.mkdir()
    rows = [{"part": "solver", "task_id": "t"}]  # solver rows are not proposals
    for seed_id, proposals in groups.items():
        rows += [{"part": "proposer", "seed_id": seed_id, "learnable": flags} for flags in proposals]
    (folder / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_shares_count_an_unparsed_proposal_as_zero(tmp_path):
    folder = _write(tmp_path / "e", {"a": [[True, False], [], [True, True, True, False]]})
    assert seed_persistence.seed_shares(folder / "samples.jsonl") == {"a": [0.5, 0.0, 0.75]}


def test_split_half_r_and_variance_by_hand():
    shares = {"a": [0.0, 0.2, 0.4, 0.6], "b": [0.5, 0.5, 1.0, 1.0], "c": [0.0, 0.0, 0.0, 0.2]}
    # halves: a 0.1 / 0.5, b 0.5 / 1.0, c 0.0 / 0.1; seed means 0.3, 0.75, 0.05
    first, second = [0.1, 0.5, 0.0], [0.5, 1.0, 0.1]
    mf, ms = sum(first) / 3, sum(second) / 3
    cov = sum((x - mf) * (y - ms) for x, y in zip(first, second))
    r = cov / math.sqrt(sum((x - mf) ** 2 for x in first) * sum((y - ms) ** 2 for y in second))
    assert seed_persistence.split_half_r(shares) == pytest.approx(r)
    means = [0.3, 0.75, 0.05]
    mean = sum(means) / 3
    assert seed_persistence.between_seed_variance(shares) == pytest.approx(
        sum((m - mean) ** 2 for m in means) / 3
    )


def test_permutation_p_separates_seed_bound_shares_from_shuffled_ones():
    bound = {f"s{i}": [1.0] * 4 if i < 5 else [0.0] * 4 for i in range(10)}  # the seed decides
    assert seed_persistence.permutation_p(bound, rounds=300) < 0.01
    mixed = {f"s{i}": [1.0, 0.0, 1.0, 0.0] for i in range(10)}  # every seed alike
    assert seed_persistence.permutation_p(mixed, rounds=300) == 1.0


def test_table_names_an_evaluation_with_one_proposal_per_seed(tmp_path):
    folder = _write(tmp_path / "one", {"a": [[True]], "b": [[False]]})
    with pytest.raises(SystemExit, match="two or more proposals"):
        seed_persistence.table([("one", folder)])
