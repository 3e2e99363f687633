"""The Slurm commands the launcher runs, and job states with fall-backs when accounting is off.

``sacct`` needs slurmdbd; many small and development clusters have none. Then a job's state comes
from ``squeue`` while it is queued or running, then from the job-completion text file
(``JobCompType=jobcomp/filetxt``), then from ``scontrol show job`` (which remembers a finished job
for ``MinJobAge`` seconds).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nemo_azr_launch.errors import LaunchError
from nemo_azr_launch.records import base_id

TIMEOUT_S = 60


@dataclass
class JobState:
    job_id: str  # "123", or "123_4" for an array task
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, REQUEUED, ... or UNKNOWN
    exit_code: str  # "rc:signal" as Slurm prints it, "" while unknown
    source: str  # sacct | squeue | jobcomp | scontrol | none


def run(cmd: list[str], *, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess | None:
    """Run a Slurm command; None when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"`{' '.join(cmd)}` did not answer within {timeout:.0f} s; is slurmctld up?"
        ) from None


def _first_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[0] if lines else "(no output)"


def partitions() -> list[str] | None:
    """Partition names from ``sinfo``; None when sinfo is missing or cannot reach the controller."""
    r = run(["sinfo", "-h", "-o", "%R"])
    if r is None or r.returncode != 0:
        return None
    return sorted({x.strip() for x in r.stdout.splitlines() if x.strip()})


def submit(script: Path, *, dependency: str = "") -> str:
    """``sbatch`` the script; returns the job id."""
    cmd = sbatch_command(script, dependency=dependency)
    r = run(cmd)
    if r is None:
        raise LaunchError("sbatch not found: run this on a Slurm login node (or use --dry-run)")
    if r.returncode != 0:
        raise LaunchError(f"sbatch failed: {_first_line(r.stderr or r.stdout)}")
    return r.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"


def sbatch_command(script: Path, *, dependency: str = "") -> list[str]:
    return ["sbatch", "--parsable", *([f"--dependency={dependency}"] if dependency else []), str(script)]


def forbid_requeue(job_ids: list[str]) -> dict[str, str]:
    """``scontrol update JobId=ID Requeue=0`` for each job; returns {job id: error} for those refused.

    A running job gets the same SIGTERM from ``scancel`` as from a preemption, checkpoints, exits 75
    and reads COMPLETING either way, so its batch script cannot tell a cancel from a preemption by
    the signal or the state. Requeue=0 tells it: the script does not requeue such a job (and Slurm
    itself refuses ``scontrol requeue`` for it). An array job id updates every task. Refused for a
    job that has finished or that the controller does not know, which need no mark.
    """
    refused = {}
    for job_id in job_ids:
        r = run(["scontrol", "update", f"JobId={job_id}", "Requeue=0"])
        if r is None:
            raise LaunchError("scontrol not found: run this on a Slurm login node")
        if r.returncode != 0:
            refused[job_id] = _first_line(r.stderr or r.stdout)
    return refused


def cancel(job_ids: list[str], *, signal: str = "") -> dict[str, str]:
    """``scancel`` the jobs for good, or send them ``signal`` instead (the preemption path).

    Cancelling marks each job Requeue=0 first (:func:`forbid_requeue`), so a running job checkpoints
    and ends instead of requeueing itself; returns the jobs that could not be marked. A signal goes
    to the batch shell (as ``--signal=B:USR1`` does), whose trap forwards it to the ranks.
    """
    refused = {} if signal else forbid_requeue(job_ids)
    cmd = ["scancel", *([f"--signal={signal}", "--batch"] if signal else []), *job_ids]
    r = run(cmd)
    if r is None:
        raise LaunchError("scancel not found: run this on a Slurm login node")
    if r.returncode != 0:
        raise LaunchError(f"scancel failed: {_first_line(r.stderr or r.stdout)}")
    return refused


def _matches(job_id: str, array_id: str, wanted: set[str]) -> bool:
    return job_id in wanted or base_id(job_id) in wanted or array_id in wanted


def _from_sacct(ids: list[str]) -> list[JobState] | None:
    r = run(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,JobName,State,ExitCode"])
    if r is None or r.returncode != 0:  # "Slurm accounting storage is disabled"
        return None
    out = []
    for line in r.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            out.append(JobState(parts[0], parts[1], parts[2].split()[0], parts[3], "sacct"))
    return out


def _from_squeue(wanted: set[str]) -> list[JobState]:
    r = run(["squeue", "-h", "-o", "%i|%F|%j|%T"])
    if r is None or r.returncode != 0:
        return []
    out = []
    for line in r.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and _matches(parts[0], parts[1], wanted):
            out.append(JobState(parts[0], parts[2], parts[3], "", "squeue"))
    return out


def _kv(line: str) -> dict[str, str]:
    """``Key=value Key2=value2`` records (scontrol -o, jobcomp/filetxt) -> dict (values without spaces)."""
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def slurm_config() -> dict[str, str]:
    r = run(["scontrol", "show", "config"])
    if r is None or r.returncode != 0:
        return {}
    conf = {}
    for line in r.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return conf


def _from_jobcomp(wanted: set[str]) -> list[JobState]:
    conf = slurm_config()
    path = conf.get("JobCompLoc", "")
    if conf.get("JobCompType") != "jobcomp/filetxt" or not path or not Path(path).is_file():
        return []
    last: dict[str, JobState] = {}  # a requeued job has one line per run; the last one counts
    for line in Path(path).read_text(errors="replace").splitlines():
        rec = _kv(line)
        job_id = rec.get("JobId", "")
        if job_id in wanted:
            last[job_id] = JobState(
                job_id,
                rec.get("Name", ""),
                rec.get("JobState", "UNKNOWN"),
                rec.get("ExitCode", ""),
                "jobcomp",
            )
    return list(last.values())


def _from_scontrol(job_id: str) -> list[JobState]:
    r = run(["scontrol", "-o", "show", "job", job_id])
    if r is None or r.returncode != 0:
        return []
    out = []
    for line in r.stdout.splitlines():
        rec = _kv(line)
        if "JobId" not in rec:
            continue
        shown = rec["JobId"]
        if rec.get("ArrayJobId") and rec.get("ArrayTaskId"):
            shown = f"{rec['ArrayJobId']}_{rec['ArrayTaskId']}"
        out.append(
            JobState(
                shown,
                rec.get("JobName", ""),
                rec.get("JobState", "UNKNOWN"),
                rec.get("ExitCode", ""),
                "scontrol",
            )
        )
    return out


def job_states(job_ids: list[str]) -> list[JobState]:
    """The state of each job (array jobs: of each task), from the best source that knows it."""
    if not job_ids:
        return []
    if shutil.which("squeue") is None:
        raise LaunchError("squeue not found: run this on a Slurm login node")
    found = _from_sacct(job_ids)
    if found is not None:
        return found
    wanted = set(job_ids)
    states = _from_squeue(wanted)
    seen = {base_id(s.job_id) for s in states} | {s.job_id for s in states}
    rest = [j for j in job_ids if j not in seen]
    # scontrol first: it lists every task of a finished array job (the jobcomp file has no array
    # fields), but only for MinJobAge seconds; the jobcomp file keeps the final state for good.
    unknown = []
    for job_id in rest:
        shown = _from_scontrol(job_id)
        states += shown
        if not shown:
            unknown.append(job_id)
    by_comp = {s.job_id: s for s in _from_jobcomp(set(unknown))}
    states += [by_comp.get(j, JobState(j, "", "UNKNOWN", "", "none")) for j in unknown]
    return states


def stdout_path(job_id: str) -> Path | None:
    """Where Slurm writes the job's output (while ``scontrol`` still knows the job)."""
    for line in (
        r.stdout.splitlines()
        if (r := run(["scontrol", "-o", "show", "job", job_id])) and r.returncode == 0
        else []
    ):
        path = _kv(line).get("StdOut")
        if path:
            return Path(path)
    return None
