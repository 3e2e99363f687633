"""benchmarks/selfplay_heldout_table.py: the paired gain against scipy's paired t statistic, and the
tables read from `nemo-azr eval` output folders."""

import json
import math
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfplay_heldout_table as table  # noqa: E402


def _eval_folder(folder: Path, rows: dict[str, tuple[float, float]], parse_rate: float) -> Path:
    """An eval output folder: solver records (task_id -> (safety, completion)) and their means."""
    folder.mkdir()
    records = [
        {
            "part": "solver",
            "task_id": task,
            "instruction": f"{task.split('-')[0]} something.",
            "safety": s,
            "completion": c,
            "harm_reward": 0.7 * s + 0.3 * c,
        }
        for task, (s, c) in rows.items()
    ]
    records.append({"part": "proposer", "parsed": True})
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def mean(key, subset):
        return sum(r[key] for r in subset) / len(subset)

    solver = [r for r in records if r["part"] == "solver"]
    verbs = sorted({r["instruction"].split()[0] for r in solver})
    by_verb = {
        v: {
            "num_tasks": len(sub := [r for r in solver if r["instruction"].startswith(v)]),
            "safety": mean("safety", sub),
            "completion": mean("completion", sub),
        }
        for v in verbs
    }
    metrics = {
        "solver": {
            "harm_reward": mean("harm_reward", solver),
            "safety": mean("safety", solver),
            "completion": mean("completion", solver),
            "refusal_rate": 0.025,
            "by_goal_verb": by_verb,
        },
        "proposer": {"parse_rate": parse_rate, "first_pass_learnable_ratio": 0.15},
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_paired_gain_matches_scipys_paired_t_statistic():
    base = {str(i): {"harm_reward": v} for i, v in enumerate([0.3, 1.0, 0.7, 1.0, 0.3, 0.7])}
    after = {str(i): {"harm_reward": v} for i, v in enumerate([1.0, 1.0, 1.0, 0.7, 0.3, 1.0])}
    mean, se, n = table.paired_gain(base, after, "harm_reward")
    b = [base[str(i)]["harm_reward"] for i in range(6)]
    a = [after[str(i)]["harm_reward"] for i in range(6)]
    assert n == 6
    assert mean == pytest.approx((sum(a) - sum(b)) / 6)
    assert mean / se == pytest.approx(stats.ttest_rel(a, b).statistic)  # t = mean / (sd / sqrt(n))


def test_paired_gain_uses_only_the_tasks_both_evaluated():
    base = {"a": {"safety": 0.0}, "b": {"safety": 1.0}, "only-base": {"safety": 0.0}}
    after = {"a": {"safety": 1.0}, "b": {"safety": 1.0}, "only-after": {"safety": 1.0}}
    mean, se, n = table.paired_gain(base, after, "safety")
    assert (mean, n) == (0.5, 2)
    assert se == pytest.approx(0.5)  # sd of [1, 0] is 0.707; / sqrt(2)
    assert math.isnan(table.paired_gain({}, after, "safety")[0])


def test_tables_from_eval_folders(tmp_path, capsys):
    first = _eval_folder(
        tmp_path / "s0", {"Mail-1": (1.0, 0.0), "Mail-2": (1.0, 0.0), "Copy-1": (0.0, 1.0)}, 0.5
    )
    second = _eval_folder(
        tmp_path / "s8", {"Mail-1": (1.0, 1.0), "Mail-2": (1.0, 0.0), "Copy-1": (1.0, 1.0)}, 0.9
    )
    table.main([f"step 0={first}", f"step 8={second}"])
    out = capsys.readouterr().out
    assert "| step 0 | 0.567 | 0.667 | 0.333 | 2.5% | 0.500 | 0.150 |" in out
    assert "| checkpoint | Copy (1) | Mail (2) |" in out
    assert "| step 8 | 1.00 / 1.00 | 0.50 / 1.00 |" in out
    # harm differences per task: Mail-1 +0.3, Mail-2 0, Copy-1 +0.7 -> mean 0.333, sd 0.351
    assert "| step 8 | 3 | +0.333 ± 0.203 | +0.333 ± 0.333 | +0.333 ± 0.333 |" in out


def test_a_folder_without_metrics_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.json"):
        table.main([f"x={tmp_path}"])
