"""benchmarks/selfplay_windows.py: window means and the trend's slope against numpy's fit."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfplay_windows  # noqa: E402

KEY = "unified_filter/initial_learnable_ratio"


def test_slope_and_standard_error_match_numpy():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    ys = [0.10, 0.05, 0.20, 0.15, 0.30, 0.20]
    slope, se = selfplay_windows.slope_with_error(xs, ys)
    fit, cov = np.polyfit(xs, ys, 1, cov=True)  # cov scaled by the residual variance over n - 2
    assert slope == pytest.approx(fit[0])
    assert se == pytest.approx(np.sqrt(cov[0, 0]))


def test_windows_average_the_steps_and_keep_the_last_record_of_a_repeated_step(tmp_path):
    # step 2 logged twice (a run resumed from before it): the later record counts
    rows = [{"step": 1, KEY: 0.1}, {"step": 2, KEY: 9.0}, {"step": 2, KEY: 0.2}, {"step": 3, KEY: 0.3}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    records = selfplay_windows.read_metrics(path)
    assert [r["step"] for r in records] == [1, 2, 3]
    table = selfplay_windows.window_table(records, 2).splitlines()
    first_pass = [name for name, _ in selfplay_windows.COLUMNS].index("first-pass learnable") + 1
    assert table[2].startswith("| 1-2 |") and table[2].split(" | ")[first_pass].strip() == "0.150"
    assert table[3].startswith("| 3-3 |") and table[3].split(" | ")[first_pass].strip() == "0.300"
    assert table[2].split(" | ")[1].strip() == "-"  # parse rate not logged


def test_plain_task_columns_appear_only_for_runs_that_logged_them():
    plain = "plain/completion_score_mean"
    without = selfplay_windows.window_table([{"step": 1, KEY: 0.1}], 1).splitlines()
    assert "plain" not in without[0]
    # logged on the steps that solved plain tasks only: the window averages those
    records = [{"step": 1, KEY: 0.1, plain: 0.2}, {"step": 2, KEY: 0.1}, {"step": 3, KEY: 0.1, plain: 0.6}]
    table = selfplay_windows.window_table(records, 3).splitlines()
    column = [c.strip() for c in table[0].strip("|").split("|")].index("plain completion")
    assert table[2].split(" | ")[column].strip(" |") == "0.400"


@pytest.mark.parametrize("xs", [[1.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
def test_an_undefined_slope_is_said_not_printed_as_nan(xs):
    slope, se = selfplay_windows.slope_with_error(xs, [0.1 * i for i in range(len(xs))])
    assert math.isnan(slope) and math.isnan(se)
    assert "no slope" in selfplay_windows.format_slope(slope, se)
    assert selfplay_windows.format_slope(0.01, 0.002) == "slope +0.1000 per 10 steps (standard error 0.0200)"
