"""SLURM clusters for the tests in this folder (slurm/local-cluster/start.sh, stop.sh): one node,
or two nodes on this one machine (``slurm_two_nodes``).

Each test module gets its own cluster (state folder and ports of its own, so a developer's cluster
on the default ports is left alone). Running these tests installs nothing unless asked to:

- ``NEMO_AZR_SLURM_TESTS`` unset: they run when Slurm is installed here (``slurmctld``, ``slurmd``,
  ``sbatch``, ``munged``) and the user is root, and are skipped, with the reason, otherwise;
- ``NEMO_AZR_SLURM_TESTS=1``: they must run: Slurm is installed with apt when missing, and a cluster
  that cannot be started is an error, not a skip;
- ``NEMO_AZR_SLURM_TESTS=0``: skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO / "slurm" / "local-cluster"
REQUEST_ENV = "NEMO_AZR_SLURM_TESTS"
SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "munged")
EXIT_PACKAGES_UNAVAILABLE = 3  # start.sh: slurm not installed and not installable (or not allowed to)
START_TIMEOUT_S = 600  # includes an apt-get install when asked for one


def slurm_tests_mode(environ=os.environ) -> str:
    """``auto`` (unset / empty), ``required`` (1, yes, true) or ``off`` (0, no, false)."""
    value = environ.get(REQUEST_ENV, "").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("1", "yes", "true", "required"):
        return "required"
    if value in ("0", "no", "false", "off"):
        return "off"
    raise pytest.UsageError(f"{REQUEST_ENV}={value!r}: use 1 (run, installing Slurm if needed) or 0 (skip)")


def why_not(mode: str, *, root: bool, installed: bool) -> str:
    """Why this machine does not run the Slurm tests in ``mode``; "" when it does."""
    if mode == "off":
        return f"{REQUEST_ENV}=0"
    if not root:
        return "the local SLURM cluster needs root (slurm/local-cluster/start.sh)"
    if not installed and mode == "auto":
        return (
            f"Slurm is not installed ({', '.join(SLURM_BINARIES)}); "
            f"{REQUEST_ENV}=1 installs it with apt and runs these tests"
        )
    return ""


def _free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 free (slurmctld, then one slurmd per node)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count - 1 > 65535:
            continue
        try:
            sockets = [socket.socket() for _ in range(count)]
            try:
                for i, sock in enumerate(sockets):
                    sock.bind(("127.0.0.1", port + i))
            finally:
                for sock in sockets:
                    sock.close()
            return port
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


#: A node whose slurmd stops answering is set DOWN (its jobs NODE_FAIL) after this many seconds;
#: Slurm's default is 300. Far above a ping's answer time on a loaded 2-core machine.
SLURMD_TIMEOUT_S = 30
START_ENV_FILE = "test-start-env.json"  # in the state folder: the settings the cluster was started with


def _start(state: Path) -> subprocess.CompletedProcess:
    """start.sh on ``state`` with the settings the cluster was (or is to be) started with."""
    return subprocess.run(
        ["bash", str(CLUSTER_DIR / "start.sh"), str(state)],
        env=dict(os.environ, **json.loads((state / START_ENV_FILE).read_text())),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )


def start_missing_daemons(state: Path) -> None:
    """Run start.sh again on a running cluster: it starts the daemons that are gone (a killed slurmd)."""
    started = _start(state)
    assert started.returncode == 0, started.stderr + _tail(state / "log" / "slurmctld.log")


#: the state folders of the clusters these tests started and are running now
_active: list[Path] = []


def _cluster(nodes: int):
    """Start a cluster of ``nodes`` nodes; yields its state folder (``SLURM_CONF`` is set meanwhile)."""
    mode = slurm_tests_mode()
    installed = all(shutil.which(b) for b in SLURM_BINARIES)
    reason = why_not(mode, root=os.geteuid() == 0, installed=installed)
    if reason:
        (pytest.fail if mode == "required" else pytest.skip)(reason)
    state = Path(tempfile.mkdtemp(prefix="nemo-azr-slurm-test-", dir="/tmp"))
    settings = dict(
        NEMO_AZR_SLURM_PORT=str(_free_ports(nodes + 1)),
        NEMO_AZR_SLURM_NODES=str(nodes),
        NEMO_AZR_SLURM_CLEAN="1",
        NEMO_AZR_SLURM_INSTALL="1" if mode == "required" else "0",
        NEMO_AZR_SLURMD_TIMEOUT=str(SLURMD_TIMEOUT_S),
    )
    (state / START_ENV_FILE).write_text(json.dumps(settings))
    env = dict(os.environ, **settings)
    started = _start(state)
    old_conf = os.environ.get("SLURM_CONF")
    try:
        if started.returncode == EXIT_PACKAGES_UNAVAILABLE and mode != "required":
            pytest.skip(f"Slurm packages unavailable: {started.stderr.strip()}")
        assert started.returncode == 0, started.stderr + _tail(state / "log" / "slurmctld.log")
        os.environ["SLURM_CONF"] = str(state / "slurm.conf")  # sbatch & co. here, and inside the jobs
        _active.append(state)
        yield state
    finally:
        if state in _active:
            _active.remove(state)
        subprocess.run(
            ["bash", str(CLUSTER_DIR / "stop.sh"), str(state)], env=env, capture_output=True, timeout=120
        )
        from tests.slurm.jobs import kill_leftovers

        kill_leftovers(state / "slurm.conf")  # what killed job steps left behind (their ranks' helpers)
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A one-node cluster for this module."""
    yield from _cluster(1)


@pytest.fixture(scope="module")
def slurm_two_nodes():
    """A two-node cluster for this module (two slurmd on this machine: slurm/local-cluster)."""
    yield from _cluster(2)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test():
    """A job a test leaves queued (it failed or timed out) is cancelled before the next test, which
    would otherwise wait behind it for the nodes and fail for a reason not its own."""
    yield
    # only on a cluster these tests started: never a SLURM_CONF the user had set (a real cluster)
    if _active and os.environ.get("SLURM_CONF") == str(_active[-1] / "slurm.conf"):
        from tests.slurm.jobs import cancel_all

        cancel_all()
