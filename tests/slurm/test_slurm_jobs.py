"""``nemo-azr-launch`` against a real one-node SLURM cluster (started by the module fixture).

A 2-rank CPU job runs to the end (one task per rank, and one torchrun per node); a job signalled
before its time limit checkpoints, requeues, resumes and logs what an uninterrupted run logs; a
3-link chain continues link to link; bad cluster configs fail before submission.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from tests.slurm.jobs import (
    JOB_TIMEOUT_S,
    job_log,
    launch,
    states,
    submit,
    tiny_overrides,
    wait_done,
    wait_for_steps,
)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_two_rank_cpu_job_runs_to_the_end(slurm_cluster, tiny_cache, tmp_path, launcher):
    """Megatron TP=2 over gloo: 2 Slurm tasks (srun) or one task running torchrun with 2 workers."""
    pytest.importorskip("megatron.core")
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, "model=megatron", "parallel=tp2pp1")
    overrides += ["cluster.tasks_per_node=2", f"cluster.launcher={launcher}", "trainer.max_steps=3"]
    overrides += ["sft_warmup.steps=0", "data.prompts_per_step=2"]
    (job,), folder = submit(*overrides, console_script=True)
    assert {p.name for p in folder.iterdir()} >= {"job.sbatch", "config.yaml", "submission.json"}
    wait_done([job])
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    # tp=2 needs a world of 2 (the trainer checks tp x pp x dp = world size), and rank 0 alone reports.
    assert log.count("completed at step 3") == 1, log
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "checkpoints" / "step_3" / "COMPLETE").is_file()
    tasks = "--ntasks-per-node=1" if launcher == "torchrun" else "--ntasks-per-node=2"
    assert f"#SBATCH {tasks}" in (folder / "job.sbatch").read_text()


@pytest.mark.slow
def test_preempted_job_requeues_and_matches_an_uninterrupted_run(slurm_cluster, tiny_cache, tmp_path):
    steps = 60
    extra = (f"trainer.max_steps={steps}", "sft_warmup.steps=20")  # warmed up: rewards > 0, real updates
    logs = tmp_path / "logs"
    reference = subprocess.Popen(  # the uninterrupted run, meanwhile, outside Slurm
        [
            sys.executable,
            "-m",
            "nemo_azr",
            "train",
            *tiny_overrides(tiny_cache, tmp_path / "ref", logs, *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = tmp_path / "run"
    (job,), folder = submit(*tiny_overrides(tiny_cache, out, logs, *extra))
    assert "#SBATCH --signal=B:USR1@60" in (folder / "job.sbatch").read_text()  # cluster=local's margin

    # Signal mid-run, as Slurm does at the time limit minus the margin (--signal=B:USR1@60).
    metrics = out / "metrics.jsonl"
    wait_for_steps(metrics, job, logs)
    r = launch("cancel", "--signal", "USR1", job)
    assert r.returncode == 0, r.stderr
    wait_done([job])
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log

    m = re.search(r"^preempted at step (\d+);", log, re.M)
    assert m, log
    k = int(m.group(1))
    assert 3 <= k < steps
    assert "got SIGUSR1, forwarding" in log and f"requeueing job {job}" in log
    assert f"job {job} restart 1" in log
    assert f"resumed from {out}/checkpoints/step_{k} (step {k})" in log
    assert f"completed at step {steps}" in log

    assert reference.wait(timeout=JOB_TIMEOUT_S) == 0, reference.stderr.read()
    a = without_machine_metrics(read_metrics(tmp_path / "ref" / "metrics.jsonl"))
    b = without_machine_metrics(read_metrics(metrics))
    assert [r["step"] for r in b] == list(range(1, steps + 1))
    assert a == b
    assert any(r["actor/grad_norm"] > 0 for r in a[k:])  # the resumed part really trained


@pytest.mark.slow
def test_three_link_chain_resumes_link_to_link(slurm_cluster, tiny_cache, tmp_path):
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, "trainer.max_steps=3", "trainer.max_steps_per_run=1")
    jobs, folder = submit("--chain", "3", *overrides, "sft_warmup.steps=0")
    assert len(jobs) == 3
    sbatch = json.loads((folder / "submission.json").read_text())["sbatch"]
    assert [next((a for a in cmd if a.startswith("--dependency")), "") for cmd in sbatch] == [
        "",
        f"--dependency=afterany:{jobs[0]}",
        f"--dependency=afterany:{jobs[1]}",
    ]
    wait_done(jobs)
    got = states(jobs, logs)
    assert all(got[j] == ("COMPLETED", "0:0") for j in jobs), got

    first, second, third = (job_log(j, logs) for j in jobs)
    assert "resumed from" not in first and "paused at step 1;" in first, first
    assert f"resumed from {out}/checkpoints/step_1 (step 1)" in second and "paused at step 2;" in second, (
        second
    )
    assert f"resumed from {out}/checkpoints/step_2 (step 2)" in third and "completed at step 3;" in third, (
        third
    )
    assert all("the next chain link resumes" in x for x in (first, second))
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "checkpoints" / "step_3" / "COMPLETE").is_file()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["cluster.partition=nope"],
            "unknown partition cluster.partition='nope'; sinfo lists: debug, urgent",
        ),
        (
            ["model=megatron", "parallel=tp2pp1", "cluster.tasks_per_node=3"],
            "cluster.nodes=1 x cluster.tasks_per_node=3 = 3 ranks, which tp 2 x pp 1 = 2 does not divide",
        ),
    ],
)
def test_bad_cluster_config_fails_before_submission(slurm_cluster, tmp_path, overrides, message):
    logs = tmp_path / "logs"
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    r = launch("submit", "cluster=local", f"cluster.log_dir={logs}", *overrides)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"nemo-azr-launch: error: {message}"
    assert not logs.exists()
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before
