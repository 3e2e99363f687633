"""scripts/soak.sh's driver, one cycle: reference run, a second writer refused, kill -9, (damage),
resume, equal final state.

The committed result (50 cycles, benchmarks/results/soak.md) takes ~8 minutes: `bash scripts/soak.sh`.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_soak_cycle_ends_equal_to_an_uninterrupted_run(tiny_cache, tmp_path):
    out = tmp_path / "soak"
    args = ["--cycles", "1", "--steps", "4", "--warmup", "2", "--corrupt-prob", "1", "--out", str(out)]
    args += ["--second-writer-prob", "1"]  # a second run on the folder while the first holds it
    proc = subprocess.run(
        [sys.executable, "benchmarks/soak.py", *args, "--cache-dir", str(tiny_cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "soak.json").read_text())
    assert result["cycles"] == 1 and result["all_equal"] and result["failures"] == []
    assert result["corruptions_handled"] == result["corruptions"]
    # the second run refused in one line naming the first, and the first's episode is still equal
    assert result["second_writers"] == result["second_writers_refused"] == 1
