"""Vocab-parallel kernels: TP=2 over gloo (two processes) equals TP=1, for torch and Triton backends."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

WORKER = Path(__file__).with_name("kernels_tp_worker.py")
HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_tp2_over_gloo_equals_tp1(tmp_path):
    backends = "torch,triton" if HAS_TRITON else "torch"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if HAS_TRITON:
        env["TRITON_INTERPRET"] = "1"  # set before the workers import triton (CPU interpreter)
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(store), backends],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert sorted(o["rank"] for o in outs) == [0, 1]
    for o in outs:
        for backend, report in o["report"].items():
            assert report["fused/metric_keys_equal"] == 1.0
            assert len(report) == 12, report
            bad = {k: v for k, v in report.items() if k != "fused/metric_keys_equal" and not v < 1e-5}
            assert not bad, (o["rank"], backend, bad)
