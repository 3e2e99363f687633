"""``nemo-azr-launch`` across two Slurm nodes: two slurmd on this machine (slurm/local-cluster with
NEMO_AZR_SLURM_NODES=2), megatron over gloo between them.

A TP=2 x DP=2 job on 2 nodes x 2 ranks, in both launcher modes (srun per rank, torchrun per node),
logs the same metrics step by step as the same run on one node with 4 ranks (torchrun outside
Slurm): the launcher's multi-node rendezvous (MASTER_ADDR from the first node's address, node ranks)
changes nothing in what is trained. The same job signalled mid-run (as at its time limit) saves
every rank's shard, requeues, resumes on both nodes and logs what the uninterrupted run logs.
"""

from __future__ import annotations

import os
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

#: Long enough that the signal sent after step 2 lands mid-run: the steps after it take tens of seconds
#: here, its delivery well under one (the one-node preemption test leaves the same margin).
STEPS = 30
TRAIN = (
    "model=megatron",
    "parallel=tp2pp1",
    f"trainer.max_steps={STEPS}",
    "sft_warmup.steps=0",
    "data.prompts_per_step=4",
)


@pytest.fixture(scope="module")
def one_node_reference(tiny_cache, tmp_path_factory):
    """The same training on one node, 4 ranks (TP=2 x DP=2), outside Slurm."""
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("one_node")
    overrides = [
        o
        for o in tiny_overrides(tiny_cache, out / "run", out / "logs", *TRAIN)
        if not o.startswith("cluster")
    ]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=4",
            "-m",
            "nemo_azr",
            "train",
            *overrides,
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline"),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return read_metrics(out / "run" / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_two_node_tp2_dp2_job_equals_the_one_node_run(
    slurm_two_nodes, one_node_reference, tiny_cache, tmp_path, launcher
):
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, *TRAIN)
    overrides += ["cluster.nodes=2", "cluster.tasks_per_node=2", f"cluster.launcher={launcher}"]
    (job,), folder = submit(*overrides)
    assert "#SBATCH --nodes=2" in (folder / "job.sbatch").read_text()
    wait_done([job])
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    assert "on nemo[1-2]" in log and f"completed at step {STEPS}" in log, log
    got = without_machine_metrics(read_metrics(out / "metrics.jsonl"))
    want = without_machine_metrics(one_node_reference)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert got == want
    assert (out / "checkpoints" / f"step_{STEPS}" / "COMPLETE").is_file()


@pytest.mark.slow
def test_two_node_job_preempted_requeues_and_matches_the_uninterrupted_run(
    slurm_two_nodes, one_node_reference, tiny_cache, tmp_path
):
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, *TRAIN)
    overrides += ["cluster.nodes=2", "cluster.tasks_per_node=2"]
    (job,), _ = submit(*overrides)
    wait_for_steps(out / "metrics.jsonl", job, logs, steps=2)
    r = launch("cancel", "--signal", "USR1", job)  # as Slurm does at the time limit minus the margin
    assert r.returncode == 0, r.stderr
    wait_done([job])
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    m = re.search(r"^preempted at step (\d+);", log, re.M)
    assert m, log
    k = int(m.group(1))
    assert 2 <= k < STEPS
    assert (out / "checkpoints" / f"step_{k}" / "COMPLETE").is_file()
    assert f"job {job} restart 1" in log and f"resumed from {out}/checkpoints/step_{k} (step {k})" in log
    assert f"completed at step {STEPS}" in log
    got = without_machine_metrics(read_metrics(out / "metrics.jsonl"))
    assert got == without_machine_metrics(one_node_reference)
