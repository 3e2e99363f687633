"""An evaluation's metrics.json marks it complete: it is written after the samples, atomically."""

from __future__ import annotations

import json

import pytest

from nemo_azr.evaluation.common import METRICS_FILE, SAMPLES_FILE, write_results


def test_results_are_written_samples_first(tmp_path):
    write_results(tmp_path, {"accuracy": 0.5, "nan": float("nan")}, [{"q": "1+1", "r": "2"}])
    assert json.loads((tmp_path / METRICS_FILE).read_text()) == {"accuracy": 0.5, "nan": None}
    assert [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()] == [
        {"q": "1+1", "r": "2"}
    ]


def test_a_failed_samples_write_leaves_no_metrics(tmp_path):
    with pytest.raises(TypeError):
        write_results(tmp_path, {"accuracy": 0.5}, [{"q": object()}])
    assert not (tmp_path / METRICS_FILE).exists()
