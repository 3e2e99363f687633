"""tests/slurm/ installs nothing unless asked: without Slurm it is skipped, with the reason."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Records a call and fails, as on a machine that must not be changed by running the tests.
FAKE_COMMAND = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_DIR/calls.log"
exit 1
"""


def run_slurm_tests(tmp_path: Path, request: str | None) -> tuple[subprocess.CompletedProcess, str]:
    """pytest on tests/slurm/ with a PATH that has no Slurm, only recording apt-get / start.sh helpers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("apt-get", "apt", "bash", "sinfo", "slurmctld", "munged"):
        (bin_dir / name).write_text(FAKE_COMMAND)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "slurmctld").unlink()  # the daemons are missing, so Slurm is "not installed"
    (bin_dir / "munged").unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NEMO_AZR_SLURM"))}
    env.update(PATH=f"{bin_dir}:{Path(sys.executable).parent}", FAKE_DIR=str(tmp_path))
    if request is not None:
        env["NEMO_AZR_SLURM_TESTS"] = request
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/slurm/",
            "-k",
            "bad_cluster",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    calls = tmp_path / "calls.log"
    return r, calls.read_text() if calls.exists() else ""


def test_without_slurm_the_tests_are_skipped_and_nothing_is_installed(tmp_path):
    r, calls = run_slurm_tests(tmp_path, request=None)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\b2 skipped\b", r.stdout) and "passed" not in r.stdout and "error" not in r.stdout
    if os.geteuid() == 0:
        reason = (
            "Slurm is not installed (slurmctld, slurmd, sbatch, munged); NEMO_AZR_SLURM_TESTS=1 installs it"
        )
    else:
        reason = "the local SLURM cluster needs root"
    assert reason in r.stdout
    assert calls == ""  # neither apt-get nor start.sh (bash) nor sinfo ran


def test_slurm_tests_off_on_request(tmp_path):
    r, calls = run_slurm_tests(tmp_path, request="0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\b2 skipped\b", r.stdout) and "NEMO_AZR_SLURM_TESTS=0" in r.stdout
    assert calls == ""
