"""A one-node SLURM cluster for the tests in this folder (slurm/local-cluster/start.sh, stop.sh).

Each test module gets its own cluster (state folder and ports of its own, so a developer's cluster
on the default ports is left alone). Skipped only when the machine cannot have one: not root, or
Slurm missing with no apt-get / no reachable package archive.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO / "slurm" / "local-cluster"
EXIT_PACKAGES_UNAVAILABLE = 3  # start.sh: slurm not installed and not installable
START_TIMEOUT_S = 600  # includes a first apt-get install


def _free_port_pair() -> int:
    """A port p with p + 1 free as well (slurmctld, slurmd)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def slurm_cluster():
    """Start a cluster for this module; yields its state folder (``SLURM_CONF`` is set meanwhile)."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (slurm/local-cluster/start.sh)")
    installed = all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged"))
    if not installed and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and apt-get is missing to install it")
    state = Path(tempfile.mkdtemp(prefix="nemo-azr-slurm-test-", dir="/tmp"))
    env = dict(os.environ, NEMO_AZR_SLURM_PORT=str(_free_port_pair()), NEMO_AZR_SLURM_CLEAN="1")
    started = subprocess.run(
        ["bash", str(CLUSTER_DIR / "start.sh"), str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    old_conf = os.environ.get("SLURM_CONF")
    try:
        if started.returncode == EXIT_PACKAGES_UNAVAILABLE:
            pytest.skip(f"Slurm packages unavailable: {started.stderr.strip()}")
        assert started.returncode == 0, started.stderr + _tail(state / "log" / "slurmctld.log")
        os.environ["SLURM_CONF"] = str(state / "slurm.conf")  # sbatch & co. here, and inside the jobs
        yield state
    finally:
        subprocess.run(
            ["bash", str(CLUSTER_DIR / "stop.sh"), str(state)], env=env, capture_output=True, timeout=120
        )
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
        shutil.rmtree(state, ignore_errors=True)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""
