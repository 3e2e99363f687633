"""The test cluster's teardown removes what killed job steps leave behind (no Slurm needed)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.slurm.jobs import kill_leftovers


def test_processes_under_the_clusters_conf_are_killed_and_others_are_not(tmp_path):
    conf, other = tmp_path / "slurm.conf", tmp_path / "other.conf"
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    ours = subprocess.Popen(sleep, env=dict(os.environ, SLURM_CONF=str(conf)))
    theirs = subprocess.Popen(sleep, env=dict(os.environ, SLURM_CONF=str(other)))
    try:
        assert kill_leftovers(conf) == [ours.pid]
        assert ours.wait(timeout=30) == -9
        assert theirs.poll() is None  # another cluster's process (or the user's) is left alone
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
