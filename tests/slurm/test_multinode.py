"""``nemo-azr-launch`` across two Slurm nodes: two slurmd on this machine (slurm/local-cluster with
NEMO_AZR_SLURM_NODES=2), megatron over gloo between them.

A TP=2 x DP=2 job on 2 nodes x 2 ranks, in both launcher modes (torchrun per node uninterrupted,
srun per rank signalled mid-run as at its time limit: it saves every rank's shard, requeues and
resumes on both nodes), logs the same metrics step by step as the same run on one node with 4 ranks
(torchrun outside Slurm): the launcher's multi-node rendezvous (MASTER_ADDR from the first node's
address, node ranks) changes nothing in what is trained. When
the second node's training processes are killed, and later in the same job stopped as a whole (a
hung node), the job ends each time with one line naming the lost ranks and their node, requeues and
resumes from its newest checkpoint; when its slurmd is killed instead, Slurm fails the job (NODE_FAIL) and requeues it, and it resumes
once the node is back. Checkpoints move between layouts and node counts (PP x DP across the nodes
under the torchrun launcher).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from tests.slurm.jobs import (
    JOB_TIMEOUT_S,
    job_log,
    launch,
    metric_lines,
    queued,
    states,
    submit,
    tiny_overrides,
    wait_done,
    wait_for_steps,
    wait_not_running,
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
    # the tiny model's rewards are 0 for many steps; the bonus gives every step a gradient, so the
    # runs compared below have weights and AdamW moments to get right
    "algorithm.entropy_coef=0.01",
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
def test_two_node_tp2_dp2_job_equals_the_one_node_run(
    slurm_two_nodes, one_node_reference, tiny_cache, tmp_path
):
    """Under the torchrun launcher (one torchrun a node); the srun launcher's run is the next test's,
    preempted half-way: a job start costs about a minute of this machine, so the two share one."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, *TRAIN)
    overrides += ["cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.launcher=torchrun"]
    (job,), folder = submit(*overrides)
    assert "#SBATCH --nodes=2" in (folder / "job.sbatch").read_text()
    wait_done([job])
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    assert "on nemo[1-2]" in log and f"completed at step {STEPS}" in log, log
    got = without_machine_metrics(read_metrics(out / "metrics.jsonl"))
    want = without_machine_metrics(one_node_reference)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert all(r["actor/grad_norm"] > 0 for r in got)
    assert got == want
    assert (out / "checkpoints" / f"step_{STEPS}" / "COMPLETE").is_file()


@pytest.mark.slow
def test_two_node_job_preempted_requeues_and_matches_the_uninterrupted_run(
    slurm_two_nodes, one_node_reference, tiny_cache, tmp_path
):
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, *TRAIN)
    overrides += ["cluster.nodes=2", "cluster.tasks_per_node=2"]  # the srun launcher: the default
    (job,), folder = submit(*overrides)
    assert "#SBATCH --nodes=2" in (folder / "job.sbatch").read_text()
    assert "srun --nodes=2 --ntasks-per-node=2 " in (folder / "job.sbatch").read_text()  # a task a rank
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
    assert "on nemo[1-2]" in log and f"completed at step {STEPS}" in log, log
    got = without_machine_metrics(read_metrics(out / "metrics.jsonl"))
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert all(r["actor/grad_norm"] > 0 for r in got)
    assert got == without_machine_metrics(one_node_reference)
    assert (out / "checkpoints" / f"step_{STEPS}" / "COMPLETE").is_file()


def _node_processes(job: str, node: str) -> list:
    """The job's training processes on ``node`` (srun's tasks there carry SLURMD_NODENAME)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            env, cmd = proc.environ(), " ".join(proc.cmdline())
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if env.get("SLURM_JOB_ID") == job and env.get("SLURMD_NODENAME") == node and "nemo_azr" in cmd:
            found.append(proc)
    return found


def _wait_for_lost_line(job: str, logs, count: int, since: float) -> float:
    """Until the job's log has ``count`` lines saying ranks were lost; the seconds since ``since``."""
    deadline = since + 240
    while job_log(job, logs).count("ranks were lost") < count:
        assert time.monotonic() < deadline, job_log(job, logs)
        time.sleep(1)
    return time.monotonic() - since


def _wait_for_resume(out, job: str, logs, restart: int, steps: int) -> None:
    """Until the job's ``restart``-th start has resumed and logged ``steps`` training steps in all."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (
        f"job {job} restart {restart}" not in job_log(job, logs)
        or metric_lines(out / "metrics.jsonl") < steps
    ):
        assert time.monotonic() < deadline and queued([job]), job_log(job, logs)
        time.sleep(0.5)


@pytest.mark.slow
def test_lost_nodes_end_the_job_in_one_line_each_and_the_requeued_job_resumes(
    slurm_two_nodes, one_node_reference, tiny_cache, tmp_path
):
    """Node nemo2's ranks are lost twice in one job: first killed (their connections close at once),
    then, once the requeued job has resumed and written a newer checkpoint, stopped (SIGSTOP: open
    connections, no progress; found by parallel.timeout_s). Each time the survivors name ranks 2, 3
    on nemo2 in one line, the batch script ends what is left of the step and requeues, and the job
    resumes from its newest checkpoint; it ends at the uninterrupted run's metrics. One job for both
    kinds of loss: a job start is the costly part here (four ranks import torch on two cores)."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    overrides = tiny_overrides(tiny_cache, out, logs, *TRAIN)
    overrides += [
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        "parallel.timeout_s=20",
        "trainer.save_interval=4",
    ]
    (job,), _ = submit(*overrides)
    wait_for_steps(out / "metrics.jsonl", job, logs, steps=5)  # step_4 is written
    victims = _node_processes(job, "nemo2")
    assert len(victims) >= 2, [p.cmdline() for p in victims]
    lost_at = time.monotonic()
    for proc in victims:
        proc.send_signal(signal.SIGKILL)
    killed_s = _wait_for_lost_line(job, logs, 1, lost_at)

    _wait_for_resume(out, job, logs, restart=1, steps=13)  # resumed, and step_12 is written
    victims = _node_processes(job, "nemo2")
    assert len(victims) >= 2, [p.cmdline() for p in victims]
    lost_at = time.monotonic()
    for proc in victims:
        proc.send_signal(signal.SIGSTOP)
    try:
        hung_s = _wait_for_lost_line(job, logs, 2, lost_at)
    finally:
        for proc in victims:  # a stopped process the step kill did not reach must not outlive the test
            if proc.is_running():
                proc.kill()
    wait_done([job])
    log = job_log(job, logs)
    assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
    errors = [line for line in log.splitlines() if line.startswith("nemo-azr: error:")]
    assert len(errors) == 2, log
    for error, hang in zip(errors, (False, True)):
        assert re.match(r"nemo-azr: error: lost ranks 2, 3 on nemo2 at step \d+: ", error), error
        assert ("Timed out" in error) == hang, error
    assert f"job {job} restart 1" in log and f"job {job} restart 2" in log, log
    assert f"completed at step {STEPS}" in log, log
    resumed = [int(k) for k in re.findall(rf"resumed from {out}/checkpoints/step_(\d+) ", log)]
    assert len(resumed) == 2 and resumed[0] >= 4 and resumed[1] >= 12, log
    got = without_machine_metrics(read_metrics(out / "metrics.jsonl"))
    assert got == without_machine_metrics(one_node_reference)
    print(f"lost node: killed -> job requeued after {killed_s:.0f} s, hung -> after {hung_s:.0f} s")


@pytest.mark.slow
def test_a_node_whose_slurmd_dies_fails_the_job_and_it_resumes_when_the_node_returns(
    slurm_two_nodes, tiny_cache, tmp_path
):
    """Node nemo2's slurmd is killed mid-run; its ranks go on (slurmstepd outlives slurmd). After
    SlurmdTimeout Slurm sets nemo2 DOWN and fails the job (NODE_FAIL): it SIGTERMs what it can
    reach, the ranks agree to stop, checkpoint and exit 75 (nemo2's too: the stop is collective),
    Slurm requeues the job and the script names the node. Nothing of the job is left running; the
    job waits for its nodes, and resumes from that checkpoint once nemo2's slurmd is back. The job
    is given more steps than it can run, so it is still training whenever the failure lands."""
    from nemo_azr.trainer.checkpoint import verify_checkpoint
    from tests.slurm.conftest import SLURMD_TIMEOUT_S, start_missing_daemons

    out, logs = tmp_path / "run", tmp_path / "logs"
    metrics = out / "metrics.jsonl"
    overrides = tiny_overrides(tiny_cache, out, logs, *TRAIN)
    overrides += [
        "trainer.max_steps=100000",  # overrides TRAIN's: ended by the test, never by itself
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        "trainer.save_interval=4",
        "trainer.keep_last=2",
    ]
    (job,), _ = submit(*overrides)
    pidfile = slurm_two_nodes / "run" / "slurmd-nemo2.pid"
    try:
        wait_for_steps(metrics, job, logs, steps=6)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        lost_at = time.monotonic()
        # SlurmdTimeout, the controller's ping interval, then KillWait (30 s) at most for the ranks
        state = wait_not_running(job, timeout=SLURMD_TIMEOUT_S + 120)
        ended_s = time.monotonic() - lost_at
        assert state == "PENDING", (state, job_log(job, logs))  # requeued by Slurm
        deadline = time.monotonic() + 60
        while left := _node_processes(job, "nemo1") + _node_processes(job, "nemo2"):
            assert time.monotonic() < deadline, [p.cmdline() for p in left]
            time.sleep(1)
        log = job_log(job, logs)
        assert "Node failure on nemo2" in log and "DUE TO NODE FAILURE" in log, log
        # The script's line: Slurm's requeue, named by the node (the ranks stopped on Slurm's
        # SIGTERM), or the lost ranks (had nemo2's ranks ended first, on their closed output). Slurm
        # SIGKILLs the script KillWait (30 s) after its SIGTERM: on a loaded host the ranks' checkpoint
        # can take all of it, and the script ends before writing a line after srun's; whatever it
        # wrote must name the node (test_launcher_render.py checks the naming on its own).
        named = (
            rf"Slurm has requeued job {job} \(node failure: nemo2 not responding\)|lost ranks 2, 3 on nemo2"
        )
        after_srun = log.rsplit("Exited with exit code", 1)[-1]
        if "nemo-azr-launch:" in after_srun:
            assert re.search(named, log), log
        complete = [p for p in (out / "checkpoints").glob("step_*") if (p / "COMPLETE").is_file()]
        k = max(int(p.name.removeprefix("step_")) for p in complete)
        assert k >= 4 and verify_checkpoint(out / "checkpoints" / f"step_{k}") is None, log
    finally:
        start_missing_daemons(slurm_two_nodes)  # nemo2 back: the requeued job starts again
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while metric_lines(metrics) < k + 2 or f"resumed from {out}/checkpoints/step_{k} (step {k})" not in (
        log := job_log(job, logs)
    ):
        assert time.monotonic() < deadline and queued([job]), job_log(job, logs)
        time.sleep(1)
    assert f"job {job} restart 1 on nemo[1-2]" in log, log
    r = launch("cancel", job)
    assert r.returncode == 0, r.stderr
    wait_done([job])
    print(f"slurmd of a node killed -> job failed and requeued by Slurm after {ended_s:.0f} s")


#: Few steps, a checkpoint every 2, and an entropy bonus: the tiny model's rewards are all 0 this
#: early, and the bonus gives every step a gradient, so the resumed runs have weights to get right.
RESHARD = (
    "model=megatron",
    "sft_warmup.steps=0",
    "algorithm.entropy_coef=0.01",
    "trainer.save_interval=2",
    "trainer.keep_last=0",
)


def _logits(model_dir, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=ids).logits


def _assert_same_model(folder_a, folder_b, ids):
    import torch

    torch.testing.assert_close(_logits(folder_b, ids), _logits(folder_a, ids), atol=1e-5, rtol=0)


def _assert_continues(run, resumed, steps):
    by_step = {r["step"]: r for r in run}
    assert [r["step"] for r in resumed] == steps
    for r in resumed:
        want = by_step[r["step"]]
        assert r["reward/mean"] == want["reward/mean"], r["step"]
        assert r["actor/loss"] == pytest.approx(want["actor/loss"], abs=1e-6), r["step"]
        assert r["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4), r["step"]


@pytest.mark.slow
def test_a_two_node_checkpoint_resumes_on_one_node_at_pp2_and_back(slurm_two_nodes, tiny_cache, tmp_path):
    """Job A: 2 nodes, TP=2 x DP=2, 6 steps. Job B: 1 node, 2 ranks, PP=2, resumes A's step_2 (weights
    and AdamW state resharded) and trains to step 4. Job C: 2 nodes, PP=2 x DP=2 under the torchrun
    launcher (megatron's rank order puts each pipeline's two stages on the two nodes, as sites place
    pipelines), resumes B's step_4 and trains to step 6. B and C log A's metrics for their steps, and
    the models of B's step 4 and C's step 6 give A's logits. Every checkpoint's manifest covers every
    shard written."""
    import torch

    from nemo_azr.trainer.checkpoint import verify_checkpoint

    def run(name, nodes, tasks, parallel, steps, *extra):
        out, logs = tmp_path / name, tmp_path / f"{name}_logs"
        overrides = tiny_overrides(tiny_cache, out, logs, *RESHARD, f"parallel={parallel}")
        overrides += [
            f"trainer.max_steps={steps}",
            f"cluster.nodes={nodes}",
            f"cluster.tasks_per_node={tasks}",
        ]
        (job,), _ = submit(*overrides, *extra)
        wait_done([job])
        log = job_log(job, logs)
        assert states([job], logs)[job] == ("COMPLETED", "0:0"), log
        return out, log

    a, _ = run("a", 2, 2, "tp2pp1", 6)
    b, log_b = run("b", 1, 2, "tp1pp2", 4, f"trainer.resume={a}/checkpoints/step_2")
    c, log_c = run(
        "c", 2, 2, "tp1pp2", 6, f"trainer.resume={b}/checkpoints/step_4", "cluster.launcher=torchrun"
    )
    assert f"resumed from {a}/checkpoints/step_2 (step 2)" in log_b
    assert f"resumed from {b}/checkpoints/step_4 (step 4)" in log_c

    run_a = read_metrics(a / "metrics.jsonl")
    _assert_continues(run_a, read_metrics(b / "metrics.jsonl"), [3, 4])
    _assert_continues(run_a, read_metrics(c / "metrics.jsonl"), [5, 6])

    for folder in [
        *(a / "checkpoints").glob("step_*"),
        b / "checkpoints" / "step_4",
        c / "checkpoints" / "step_6",
    ]:
        assert verify_checkpoint(folder) is None, folder  # every file matches the manifest
        listed = set(json.loads((folder / "COMPLETE").read_text())["files"])
        shards = {str(p.relative_to(folder)) for p in (folder / "dist").rglob("*") if p.is_file()}
        assert shards and shards <= listed, folder

    ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    start, end = (
        _logits(a / "checkpoints" / "step_2" / "model", ids),
        _logits(a / "checkpoints" / "step_6" / "model", ids),
    )
    assert float((end - start).abs().max()) > 1e-4  # the steps changed the model
    _assert_same_model(a / "checkpoints" / "step_4" / "model", b / "checkpoints" / "step_4" / "model", ids)
    _assert_same_model(a / "checkpoints" / "step_6" / "model", c / "checkpoints" / "step_6" / "model", ids)
