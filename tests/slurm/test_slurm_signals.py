"""A user's cancel and a preemption, on a real one-node SLURM cluster (started by the module fixture).

Both reach a running job as SIGTERM, and the trainer checkpoints and exits 75 either way; the job
must then end for good after ``nemo-azr-launch cancel`` or a plain ``scancel``, and requeue and resume
after a preemption (a job of the higher-tier partition ``urgent`` taking the node, PreemptMode=REQUEUE,
or CANCEL with a grace time).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from nemo_azr.trainer.metrics import read_metrics
from tests.slurm.jobs import (
    JOB_TIMEOUT_S,
    job_log,
    launch,
    queued,
    states,
    submit,
    tiny_overrides,
    wait_done,
    wait_for_steps,
    wait_not_running,
)

URGENT = "urgent"  # slurm/local-cluster/start.sh: its jobs preempt those of the default partition


def complete_checkpoints(out) -> list[int]:
    folder = out / "checkpoints"
    return sorted(int(p.name[5:]) for p in folder.glob("step_*") if (p / "COMPLETE").is_file())


@pytest.mark.slow
def test_user_cancel_ends_a_running_job_without_requeue(slurm_cluster, tiny_cache, tmp_path):
    out, logs = tmp_path / "run", tmp_path / "logs"
    (job,), _ = submit(*tiny_overrides(tiny_cache, out, logs, "trainer.max_steps=2000", "sft_warmup.steps=0"))
    wait_for_steps(out / "metrics.jsonl", job, logs)

    r = launch("cancel", job, "--log-dir", str(logs))
    assert r.returncode == 0 and r.stdout.strip() == f"cancelled {job}", r.stderr
    # A requeued job would be PENDING here (and run again some seconds later): it must be over.
    assert wait_not_running(job) == "CANCELLED", job_log(job, logs)
    assert not queued([job])

    log = job_log(job, logs)
    assert "got SIGTERM, forwarding" in log  # the same signal a preemption sends ...
    assert "training exited with status 75" in log  # ... and the same checkpoint-and-exit
    assert f"job {job} may not requeue (Requeue=0: cancelled with nemo-azr-launch cancel" in log
    assert "requeueing" not in log and f"job {job} restart 1" not in log
    assert complete_checkpoints(out), "the cancelled run kept no checkpoint"
    assert states([job], logs)[job][0] == "CANCELLED"


@pytest.mark.slow
def test_plain_scancel_ends_a_running_job_without_requeue(slurm_cluster, tiny_cache, tmp_path):
    """`scancel JOBID` as a user types it (no Requeue=0 first): the job checkpoints and ends."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    (job,), _ = submit(*tiny_overrides(tiny_cache, out, logs, "trainer.max_steps=2000", "sft_warmup.steps=0"))
    wait_for_steps(out / "metrics.jsonl", job, logs)

    subprocess.run(["scancel", job], check=True)
    assert wait_not_running(job) == "CANCELLED", job_log(job, logs)
    assert not queued([job])

    log = job_log(job, logs)
    assert "got SIGTERM, forwarding" in log and "training exited with status 75" in log
    assert f"SIGTERM reached job {job} (scancel, or a preemption Slurm does not requeue)" in log
    assert "; requeueing job" not in log and f"job {job} restart 1" not in log
    assert complete_checkpoints(out), "the cancelled run kept no checkpoint"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preempt_mode", "grace_s", "outcome"),
    [
        # The whole job gets SIGTERM and Slurm requeues it; the script must not requeue it again.
        ("REQUEUE", 0, "Slurm has requeued job {job} (preemption)"),
        # The ranks get SIGTERM at the start of the grace time and the job is still running (or, in
        # CANCEL mode, about to be cancelled): the script requeues it itself.
        ("CANCEL", 10, "/checkpoints/step_"),  # "newest checkpoint .../step_N; requeueing job N"
    ],
)
def test_preempted_job_requeues_and_resumes(
    slurm_cluster, tiny_cache, tmp_path, preempt_mode, grace_s, outcome
):
    steps = 150  # long enough that the preemption lands before the run ends (a step takes ~0.1 s)
    out, logs = tmp_path / "run", tmp_path / "logs"
    partition = "debug"
    subprocess.run(
        [
            "scontrol",
            "update",
            f"PartitionName={partition}",
            f"PreemptMode={preempt_mode}",
            f"GraceTime={grace_s}",
        ],
        check=True,
    )
    try:
        (job,), _ = submit(
            *tiny_overrides(tiny_cache, out, logs, f"trainer.max_steps={steps}", "sft_warmup.steps=0")
        )
        wait_for_steps(out / "metrics.jsonl", job, logs)
        # A job of the higher tier that needs the whole node: Slurm preempts the training job.
        urgent = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--partition={URGENT}",
                "--exclusive",
                "--output=/dev/null",
                "--wrap=sleep 1",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        wait_done([job, urgent])
    finally:
        subprocess.run(
            ["scontrol", "update", f"PartitionName={partition}", "PreemptMode=REQUEUE", "GraceTime=0"],
            check=True,
        )
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    assert "training exited with status 75" in log
    assert outcome.format(job=job) in log, log
    assert "may not requeue" not in log and "requeue failed" not in log
    assert f"job {job} restart 1" in log

    m = re.search(rf"^resumed from {re.escape(str(out))}/checkpoints/step_(\d+) \(step \d+\)", log, re.M)
    assert m, log
    assert 3 <= int(m.group(1)) < steps
    assert f"completed at step {steps}" in log
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, steps + 1))


@pytest.mark.slow
def test_a_time_limit_signal_in_the_jobs_first_moment_requeues_it(slurm_cluster, tiny_cache, tmp_path):
    """SIGUSR1 to the batch shell in its first milliseconds (here: while cluster.setup runs, before
    srun): the shell holds it instead of dying of it (the job would end FAILED), starts nothing,
    requeues, and the requeued job trains to the end. The set-up waits for the test (a go file), so
    the signal lands there however loaded the machine is."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    started, go = tmp_path / "setup-started", tmp_path / "go"
    setup = f"cluster.setup=['touch {started}; until [ -e {go} ]; do sleep 0.05; done']"
    (job,), folder = submit(
        *tiny_overrides(tiny_cache, out, logs, "trainer.max_steps=3", "sft_warmup.steps=0", setup)
    )
    output = folder / f"slurm-{job}.out"

    def wait_for(what) -> None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not what():
            assert time.monotonic() < deadline and queued([job]), job_log(job, logs)
            time.sleep(0.01)

    wait_for(started.exists)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    wait_for(lambda: output.is_file() and "holding it" in output.read_text())
    go.touch()
    wait_done([job])
    log = job_log(job, logs)
    assert "got SIGUSR1 while the training processes start; holding it" in log, log
    assert "SIGUSR1 came before the training processes started; not starting them" in log, log
    assert f"requeueing job {job}" in log and f"job {job} restart 1" in log, log
    assert "completed at step 3" in log, log
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    assert log.rstrip().splitlines()[-1] == f"nemo-azr-launch: job {job} exits with status 0"
