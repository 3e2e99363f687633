"""Helpers for the tests in this folder: run ``nemo-azr-launch``, follow jobs, read their logs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 600  # a 2-node job on a loaded 2-core machine: its requeue and 30 steps take minutes
CLI_TIMEOUT_S = 120
_SUBMITTED = re.compile(r"^submitted (?:job|chain of \d+|array of \d+): ([\d ]+); logs in (\S+)$", re.M)


def launch_cmd(console_script: bool) -> list[str]:
    """``nemo-azr-launch`` (the console script next to this interpreter) or ``python -m nemo_azr_launch``."""
    script = Path(sys.executable).with_name("nemo-azr-launch")
    return [str(script)] if console_script and script.is_file() else [sys.executable, "-m", "nemo_azr_launch"]


def launch(*args: str, console_script: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*launch_cmd(console_script), *args],
        cwd=REPO,  # the job's working directory
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def submit(*args: str, console_script: bool = False) -> tuple[list[str], Path]:
    r = launch("submit", *args, console_script=console_script)
    assert r.returncode == 0, r.stderr
    m = _SUBMITTED.search(r.stdout)
    assert m, r.stdout
    return m.group(1).split(), Path(m.group(2))


def queued(job_ids: list[str]) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%F|%T"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    return [r[0] for r in rows if r[1] in job_ids or r[0] in job_ids]


def wait_done(job_ids: list[str], timeout: float = JOB_TIMEOUT_S) -> None:
    """Until none of the jobs is pending or running (a requeued job stays queued meanwhile). On a
    timeout the message says what each job is doing (state, reason, restarts, its output's last
    lines), so a slow machine and a stuck job read differently."""
    deadline = time.monotonic() + timeout
    while queued(job_ids):
        assert time.monotonic() < deadline, f"jobs {job_ids} still queued after {timeout} s\n" + describe(
            job_ids
        )
        time.sleep(1)


def describe(job_ids: list[str], lines: int = 40) -> str:
    """``scontrol show job`` (state, reason, restart count) and the tail of each job's output."""
    parts = []
    for job in job_ids:
        show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        fields = dict(re.findall(r"\b(JobState|Reason|Restarts|RunTime|StdOut|NodeList)=(\S+)", show))
        parts.append(f"job {job}: {fields}")
        out = Path(fields.get("StdOut", ""))
        if out.is_file():
            parts += out.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(parts)


def cancel_all(timeout: float = 60) -> list[str]:
    """Cancel every job still queued and wait until it has left the queue; returns their ids. The
    test clusters are private to the tests, so a job a failed test left behind is never anyone's."""
    left = queued_all()
    if left:
        subprocess.run(["scancel", *left], capture_output=True, text=True)
        deadline = time.monotonic() + timeout
        while queued_all() and time.monotonic() < deadline:
            time.sleep(0.5)
    return left


def queued_all() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    return out.split()


def states(job_ids: list[str], log_dir: Path) -> dict[str, tuple[str, str]]:
    r = launch("status", *job_ids, "--log-dir", str(log_dir))
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    return {row[0]: (row[2], row[3]) for row in rows}


def job_log(job_id: str, log_dir: Path) -> str:
    r = launch("logs", job_id, "--log-dir", str(log_dir))
    assert r.returncode == 0, r.stderr
    return r.stdout


def tiny_overrides(tiny_cache: str, out: Path, log_dir: Path, *extra: str) -> list[str]:
    return [
        "cluster=local",
        f"cluster.log_dir={log_dir}",
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        "data.prompts_per_step=4",
        "generation.n_samples=4",
        "trainer.num_threads=1",
        *extra,
    ]


def metric_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def wait_for_steps(metrics: Path, job: str, log_dir: Path, steps: int = 3) -> None:
    """Until the job has logged ``steps`` training steps (it is then inside fit())."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while metric_lines(metrics) < steps:
        assert time.monotonic() < deadline and queued([job]), log_or_state(job, log_dir)
        time.sleep(0.2)


def log_or_state(job: str, log_dir: Path) -> str:
    """The job's output, or (when it has none yet: still pending) what Slurm says about it."""
    r = launch("logs", job, "--log-dir", str(log_dir))
    return r.stdout if r.returncode == 0 else f"{r.stderr.strip()}\n{describe([job])}"


def squeue_states(job_ids: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i|%T"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    return {r[0]: r[1] for r in rows if r[0] in job_ids}


def wait_not_running(job: str, timeout: float = JOB_TIMEOUT_S) -> str:
    """Until the job is neither running nor completing; returns the state it is in then (PENDING
    after a requeue, COMPLETED / CANCELLED / ... once done)."""
    deadline = time.monotonic() + timeout
    while (state := squeue_states([job]).get(job, "")) in ("RUNNING", "COMPLETING", "CONFIGURING"):
        assert time.monotonic() < deadline, f"job {job} still {state} after {timeout} s"
        time.sleep(0.2)
    return state


def kill_leftovers(slurm_conf: Path) -> list[int]:
    """SIGKILL every process started under the test cluster whose ``SLURM_CONF`` is ``slurm_conf``.

    A job step that Slurm kills, or whose node a test stops or kills, can leave processes of its own
    behind (a rank's spawned helpers, re-parented to init once the rank dies); stopping the daemons
    does not reach them, and each holds its memory until the machine goes down. Every process of a
    job inherits the cluster's ``SLURM_CONF``, a temporary path no other process has."""
    import os
    import signal

    marker = f"SLURM_CONF={slurm_conf}\0".encode()
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ProcessLookupError):  # gone already, or not ours to read
            continue
    return killed
