"""nemo-azr plot-selfplay: the series it reads from metrics.jsonl, and the figure it writes."""

import json

import pytest

from nemo_azr.errors import DataError
from nemo_azr.selfplay.plot import plot_selfplay, read_selfplay_series, rolling_mean


def test_series_are_read_in_step_order_and_plotted(tmp_path):
    rows = [
        {
            "step": s,
            "unified_filter/learnable_ratio": 0.1 * s,
            "proposer/valid_task_rate": 0.5,
            "harm/safety_score_mean": 0.6 + 0.1 * s,
            "harm/completion_score_mean": 0.4,
        }
        for s in range(3)
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    series = read_selfplay_series(metrics)
    assert series["harm/safety_score_mean"] == [(0, 0.6), (1, pytest.approx(0.7)), (2, pytest.approx(0.8))]
    assert series["proposer/valid_task_rate"] == [(0, 0.5), (1, 0.5), (2, 0.5)]
    assert series["proposer/reward_mean"] == []  # absent keys are empty, not an error
    plot_selfplay(metrics, tmp_path / "out" / "selfplay.png")
    assert (tmp_path / "out" / "selfplay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rolling_mean_by_hand_and_a_file_without_selfplay_metrics(tmp_path):
    assert rolling_mean([1.0, 3.0, 5.0], window=2) == [1.0, 2.0, 4.0]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "reward/mean": 1.0}) + "\n")
    with pytest.raises(DataError, match="no self-play metrics"):
        read_selfplay_series(metrics)
