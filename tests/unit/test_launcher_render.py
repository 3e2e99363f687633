"""``nemo-azr-launch submit --dry-run``: the rendered sbatch script, without Slurm.

The last tests run the rendered script itself with fake ``srun``/``scontrol`` on PATH, to check the
trap / forward / requeue logic of the template (the real-cluster tests are in tests/slurm/).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from nemo_azr_launch import cli
from nemo_azr_launch.render import fill

BASE = ["trainer.max_steps=3", "logger=quiet"]


def dry_run(capsys, tmp_path, *args: str) -> str:
    rc = cli.main(["submit", "--dry-run", *args, f"cluster.log_dir={tmp_path / 'logs'}", *BASE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert not (tmp_path / "logs").exists()  # a dry run writes nothing
    return out


def script_of(out: str) -> str:
    return "\n".join(x for x in out.splitlines() if not x.startswith("# submit:"))


def headers(out: str) -> list[str]:
    return [x.removeprefix("#SBATCH ") for x in out.splitlines() if x.startswith("#SBATCH ")]


def test_single_job_headers_and_srun_line(capsys, tmp_path):
    out = dry_run(
        capsys,
        tmp_path,
        "cluster.partition=batch",
        "cluster.account=proj",
        "cluster.time=02:00:00",
        "cluster.signal_margin_s=90",
        "cluster.sbatch_flags=[--exclusive]",
        "+cluster.env.FOO=bar baz",
    )
    h = headers(out)
    assert h[:6] == [
        "--job-name=arithmetic_grpo",
        "--partition=batch",
        "--account=proj",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--time=02:00:00",
    ]
    assert "--signal=B:USR1@90" in h and "--requeue" in h and "--exclusive" in h
    (output,) = [x for x in h if x.startswith("--output=")]
    assert re.fullmatch(
        rf"--output={tmp_path}/logs/arithmetic_grpo-\d{{8}}-\d{{6}}-[0-9a-f]{{4}}/slurm-%j\.out", output
    )
    assert not any(x.startswith(("--array", "--gpus", "--dependency")) for x in h)
    assert "export FOO='bar baz'" in out
    assert "CHAIN=0" in out
    assert re.search(r"^srun --nodes=1 --ntasks-per-node=1 --kill-on-bad-exit=0 \\$", out, re.M)
    assert re.search(r'-m nemo_azr_launch\.task train "\$\{OVERRIDES\[@\]\}" &$', out, re.M)
    assert "--container-image" not in out
    overrides = re.search(r"^OVERRIDES=\((.*)\)$", out, re.M).group(1)
    assert "trainer.max_steps=3" in overrides and "cluster.partition=batch" in overrides
    (submit,) = [x for x in out.splitlines() if x.startswith("# submit:")]
    assert re.fullmatch(r"# submit: sbatch --parsable \S+/job\.sbatch", submit)
    subprocess.run(["bash", "-n"], input=script_of(out), text=True, check=True)  # valid bash


def test_torchrun_per_node_with_pyxis_container(capsys, tmp_path):
    out = dry_run(
        capsys,
        tmp_path,
        "model=megatron",
        "parallel=tp2pp1",
        "cluster.launcher=torchrun",
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        "cluster.gpus_per_node=2",
        "cluster.cpus_per_task=4",
        "cluster.container_image='nvcr.io#nvidia/pytorch:25.01-py3'",  # Hydra needs the # quoted
        "cluster.container_mounts=[/lustre:/lustre,/home:/home:ro]",
    )
    h = headers(out)
    assert "--nodes=2" in h and "--ntasks-per-node=1" in h  # one torchrun per node
    assert "--gpus-per-node=2" in h and "--cpus-per-task=8" in h  # the node's workers' CPUs
    assert 'MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in out
    assert (
        'MASTER_ADDR=$(scontrol show node "$MASTER_NODE"' in out
        and "MASTER_ADDR=${MASTER_ADDR:-$MASTER_NODE}" in out
    )
    srun = re.search(r"^srun .*$", out, re.M).group(0)
    assert "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in srun
    assert "--container-mounts=/lustre:/lustre,/home:/home:ro" in srun
    assert f"--container-workdir={os.getcwd()}" in srun
    launch = out[out.index(srun) + len(srun) :].splitlines()[1].strip()
    assert launch.startswith("python -m nemo_azr_launch.torchrun_node --nnodes=2 --nproc-per-node=2 ")
    assert '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"' in launch
    assert launch.endswith('-m nemo_azr train "${OVERRIDES[@]}" &')


def test_multirun_sweep_is_a_job_array(capsys, tmp_path):
    out = dry_run(capsys, tmp_path, "-m", "--max-parallel", "2", "seed=0,1,2", "algorithm=grpo,rloo")
    h = headers(out)
    assert "--array=0-5%2" in h
    assert any(x.endswith("/slurm-%A_%a.out") for x in h)
    cases = re.findall(r"^    (\d+)\) OVERRIDES=\((.*)\) ;;$", out, re.M)
    assert [int(i) for i, _ in cases] == list(range(6))
    sets = [c for _, c in cases]
    assert "seed=0" in sets[0] and "algorithm=grpo" in sets[0] and "algorithm=rloo" in sets[1]
    assert "seed=2" in sets[5] and "algorithm=rloo" in sets[5]
    # every task trains into its own folder (they would resume from each other's checkpoints)
    dirs = [re.search(r"trainer\.output_dir=(\S+)", c).group(1) for c in sets]
    assert dirs == [f"outputs/arithmetic_grpo/{i}" for i in range(6)]
    subprocess.run(["bash", "-n"], input=script_of(out), text=True, check=True)


def test_chain_links_depend_on_the_previous_one(capsys, tmp_path):
    out = dry_run(capsys, tmp_path, "--chain", "3", "trainer.max_steps_per_run=1")
    submits = [x for x in out.splitlines() if x.startswith("# submit:")]
    assert len(submits) == 3
    assert "--dependency" not in submits[0]
    assert "--dependency=afterany:<job id of link 1>" in submits[1]
    assert "--dependency=afterany:<job id of link 2>" in submits[2]
    assert "--no-requeue" in headers(out) and "CHAIN=1" in out


def test_fill_rejects_a_slot_without_value():
    assert fill("a {{x}} b", {"x": "1"}) == "a 1 b"
    with pytest.raises(Exception, match="slots without a value: y"):
        fill("{{x}} {{y}}", {"x": "1"})


# --- the rendered script's own logic, with fake srun / scontrol ----------------------------------
FAKE_SRUN = """#!/bin/bash
# A "training" that checkpoints and exits 75 on SIGUSR1/SIGTERM (as the trainer does), else $FAKE_RC.
# For its first $FAKE_WINDOW_TICKS x 0.1 s it has no handler (a Python process starting up).
echo "srun args: $*"
echo $$ > "$FAKE_DIR/srun.pid"
if [ -n "${FAKE_WINDOW_TICKS:-}" ]; then
    touch "$FAKE_DIR/started"
    for _ in $(seq "$FAKE_WINDOW_TICKS"); do sleep 0.1; done
fi
trap 'echo "rank: got USR1"; exit 75' USR1
trap 'echo "rank: got TERM"; exit 75' TERM
touch "$NEMO_AZR_READY_DIR/rank-0"  # what nemo_azr.trainer.preemption.report_ready does
touch "$FAKE_DIR/started"
for _ in $(seq "${FAKE_TICKS:-100}"); do sleep 0.1; done
exit "${FAKE_RC:-0}"
"""
FAKE_SCONTROL = """#!/bin/bash
# `show hostnames`: one node; `-o show job`: the job record in $FAKE_JOB_RECORD; anything else: ok.
echo "$*" >> "$FAKE_DIR/scontrol.log"
[ "$1" = show ] && echo node1
[ "$1 $2 $3" = "-o show job" ] && echo "${FAKE_JOB_RECORD:-}"
exit 0
"""

FAKE_SINFO = """#!/bin/bash
# the job's nodes that are down / not responding: $FAKE_DOWN_NODES, one per line (none when unset)
echo "$*" >> "$FAKE_DIR/sinfo.log"
[ -n "${FAKE_DOWN_NODES:-}" ] && tr ',' '\\n' <<< "$FAKE_DOWN_NODES"
exit 0
"""


def run_script(
    capsys,
    tmp_path,
    *args: str,
    signal_it: bool,
    env_extra: dict | None = None,
    signum: int = signal.SIGUSR1,
    to_ranks_only: bool = False,
):
    script = tmp_path / "job.sbatch"
    script.write_text(script_of(dry_run(capsys, tmp_path, *args)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("sinfo", FAKE_SINFO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path))
    env.update(SLURM_JOB_ID="42", SLURM_JOB_NODELIST="node1", **(env_extra or {}))
    proc = subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if signal_it:
        deadline = time.monotonic() + 10
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if to_ranks_only:  # a preemption's grace time: Slurm signals the job steps, not the batch shell
            os.kill(int((tmp_path / "srun.pid").read_text()), signum)
        else:  # SIGUSR1: what --signal=B:USR1 does; SIGTERM: scancel, a preemption without grace
            proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    log = tmp_path / "scontrol.log"
    return proc.returncode, out, log.read_text() if log.exists() else ""


def test_script_forwards_usr1_and_requeues_on_75(capsys, tmp_path):
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=True)
    assert "got SIGUSR1, forwarding" in out and "rank: got USR1" in out
    assert "training exited with status 75" in out
    assert "requeue 42" in scontrol and rc == 0


def test_script_names_the_checkpoint_the_run_left_or_says_there_is_none(capsys, tmp_path):
    """Exit 75 also follows a signal before anything could be saved: the script reports what is in
    the run's checkpoints/ folder (the newest complete step), not "checkpoint written"."""
    out = tmp_path / "run"
    rc, log, _ = run_script(capsys, tmp_path, f"trainer.output_dir={out}", signal_it=True)
    assert "no checkpoint yet (a restart begins at step 0); requeueing job 42" in log and rc == 0
    for step, complete in ((3, True), (10, True), (12, False)):  # step_12: an unfinished save
        (out / "checkpoints" / f"step_{step}").mkdir(parents=True)
        if complete:
            (out / "checkpoints" / f"step_{step}" / "COMPLETE").write_text("{}")
    (tmp_path / "started").unlink()
    rc, log, _ = run_script(capsys, tmp_path, f"trainer.output_dir={out}", signal_it=True)
    assert f"newest checkpoint {out}/checkpoints/step_10; requeueing job 42" in log and rc == 0


def test_a_signal_before_the_ranks_are_ready_is_held_then_forwarded(capsys, tmp_path):
    """SIGUSR1 in a rank's first moments (no handler yet: the default action would kill it) is held
    by the batch shell until every rank has reported ready, then forwarded: checkpoint, requeue."""
    rc, out, scontrol = run_script(
        capsys, tmp_path, f"trainer.output_dir={tmp_path / 'run'}", signal_it=True,
        env_extra={"FAKE_WINDOW_TICKS": "10"},
    )  # fmt: skip
    assert "got SIGUSR1 while the training processes start; holding it" in out
    assert "the training processes are ready; forwarding SIGUSR1" in out and "rank: got USR1" in out
    assert "training exited with status 75" in out and "requeue 42" in scontrol and rc == 0
    assert not list((tmp_path / "run").glob(".ready-*"))  # the markers are cleaned up


def test_a_signal_during_set_up_is_held_and_nothing_is_started(capsys, tmp_path):
    """SIGUSR1 while the batch shell runs cluster.setup (before srun, milliseconds after the job
    starts): the shell does not die of it (the job would end FAILED); it starts no training, and
    requeues as after any time-limit warning. The script's own status is its last line."""
    setup = f"touch {tmp_path}/started; sleep 2"
    rc, out, scontrol = run_script(
        capsys,
        tmp_path,
        f"cluster.setup=['{setup}']",
        f"trainer.output_dir={tmp_path / 'run'}",
        signal_it=True,
    )
    assert "got SIGUSR1 while the training processes start; holding it" in out
    assert "SIGUSR1 came before the training processes started; not starting them" in out
    assert "srun args" not in out  # nothing was started
    assert "no checkpoint yet (a restart begins at step 0); requeueing job 42" in out
    assert "requeue 42" in scontrol and rc == 0
    assert out.splitlines()[-1] == "nemo-azr-launch: job 42 exits with status 0"
    assert not list((tmp_path / "run").glob(".ready-*"))


def test_a_scancel_during_set_up_ends_the_job(capsys, tmp_path):
    """SIGTERM (scancel) during set-up: nothing started, the job ends with 75 and is not requeued."""
    setup = f"touch {tmp_path}/started; sleep 2"
    env = {"FAKE_JOB_RECORD": RECORD + "Requeue=1 Restarts=0 BatchFlag=1"}
    rc, out, scontrol = run_script(
        capsys, tmp_path, f"cluster.setup=['{setup}']", signal_it=True, signum=signal.SIGTERM, env_extra=env
    )
    assert "srun args" not in out and "not requeueing" in out
    assert "requeue 42" not in scontrol and rc == 75
    assert out.splitlines()[-1] == "nemo-azr-launch: job 42 exits with status 75"


def test_chain_link_ends_on_75_without_requeue(capsys, tmp_path):
    rc, out, scontrol = run_script(capsys, tmp_path, "--chain", "2", signal_it=True)
    assert "the next chain link resumes" in out and rc == 0
    assert "requeue" not in scontrol


def test_script_passes_a_failure_through(capsys, tmp_path):
    rc, out, scontrol = run_script(
        capsys, tmp_path, signal_it=False, env_extra={"FAKE_RC": "3", "FAKE_TICKS": "3"}
    )
    assert rc == 3 and "requeue" not in scontrol


def test_requeue_limit(capsys, tmp_path):
    rc, out, scontrol = run_script(
        capsys, tmp_path, "cluster.max_requeues=2", signal_it=True, env_extra={"SLURM_RESTART_COUNT": "2"}
    )
    assert rc == 75 and "requeue" not in scontrol and "cluster.max_requeues" in out


RECORD = "JobId=42 JobName=arithmetic_grpo JobState=COMPLETING Reason=None Dependency=(null) "


def test_cancelled_job_checkpoints_and_ends_without_requeue(capsys, tmp_path):
    """scancel after `nemo-azr-launch cancel` set Requeue=0: SIGTERM, checkpoint (75), no requeue."""
    env = {"FAKE_JOB_RECORD": RECORD + "Requeue=0 Restarts=0 BatchFlag=1"}
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=True, signum=signal.SIGTERM, env_extra=env)
    assert "got SIGTERM, forwarding" in out and "rank: got TERM" in out
    assert "may not requeue (Requeue=0" in out
    assert "requeue 42" not in scontrol and rc == 75


def test_preempted_job_that_slurm_requeued_is_not_requeued_again(capsys, tmp_path):
    """PreemptMode=REQUEUE: Slurm has requeued the job (Restarts 1 > this run's 0) before it exits 75."""
    env = {"FAKE_JOB_RECORD": RECORD + "Requeue=1 Restarts=1 BatchFlag=1"}
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=True, signum=signal.SIGTERM, env_extra=env)
    assert "Slurm has requeued job 42 (preemption)" in out
    assert "requeue 42" not in scontrol and rc == 0


def test_a_job_slurm_requeued_after_a_node_failure_names_the_node(capsys, tmp_path):
    """A node of the job stopped answering (its slurmd gone for SlurmdTimeout): Slurm fails the job
    (NODE_FAIL), SIGTERMs what is left and requeues it; the trainer checkpoints (75) and the script
    names the job's down nodes instead of calling it a preemption."""
    env = {"FAKE_JOB_RECORD": RECORD + "Requeue=1 Restarts=1 BatchFlag=1", "FAKE_DOWN_NODES": "node2"}
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=True, signum=signal.SIGTERM, env_extra=env)
    assert "Slurm has requeued job 42 (node failure: node2 not responding)" in out
    assert "-n node1" in (tmp_path / "sinfo.log").read_text()  # only the job's own nodes are asked about
    assert "requeue 42" not in scontrol and rc == 0


def test_preempted_job_in_its_grace_time_requeues_itself(capsys, tmp_path):
    """SIGTERM to the ranks only, the job still requeueable and not requeued by Slurm (a preemption's
    GraceTime): the script requeues it, as after SIGUSR1."""
    env = {"FAKE_JOB_RECORD": RECORD.replace("COMPLETING", "RUNNING") + "Requeue=1 Restarts=0 BatchFlag=1"}
    rc, out, scontrol = run_script(
        capsys, tmp_path, signal_it=True, signum=signal.SIGTERM, env_extra=env, to_ranks_only=True
    )
    assert "rank: got TERM" in out and "got SIGTERM, forwarding" not in out
    assert "requeueing job 42" in out
    assert "requeue 42" in scontrol and rc == 0


def test_plain_scancel_ends_the_job_without_requeue(capsys, tmp_path):
    """A plain `scancel JOBID`: SIGTERM to the batch shell, the job requeueable (Requeue=1) and not
    requeued by Slurm: the trainer checkpoints (75) and the job ends; it never requeues itself."""
    env = {"FAKE_JOB_RECORD": RECORD + "Requeue=1 Restarts=0 BatchFlag=1"}
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=True, signum=signal.SIGTERM, env_extra=env)
    assert "got SIGTERM, forwarding" in out and "training exited with status 75" in out
    assert "SIGTERM reached job 42 (scancel, or a preemption Slurm does not requeue)" in out
    assert "requeue 42" not in scontrol and rc == 75


def test_lost_ranks_after_slurm_requeued_the_job_name_the_node_and_do_not_requeue_again(capsys, tmp_path):
    # A node's slurmd dies: Slurm fails the job (NODE_FAIL) and requeues it (Restarts 1 > this run's
    # 0) before the surviving ranks exit 76. A second `scontrol requeue` would fail on the pending job
    # and tell the user to resubmit; the script says what Slurm did instead, naming the down node.
    env = {
        "FAKE_RC": "76",
        "FAKE_TICKS": "1",
        "FAKE_JOB_RECORD": RECORD + "Requeue=1 Restarts=1 BatchFlag=1",
        "FAKE_DOWN_NODES": "node2",
    }
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=False, env_extra=env)
    assert "Slurm has requeued job 42 (node failure: node2 not responding)" in out, out
    assert "requeue 42" not in scontrol and "resubmit" not in out and rc == 0
    # the same loss while Slurm has not requeued it: the script requeues the job itself
    env["FAKE_JOB_RECORD"] = RECORD + "Requeue=1 Restarts=0 BatchFlag=1"
    rc, out, scontrol = run_script(capsys, tmp_path, signal_it=False, env_extra=env)
    assert "ranks were lost" in out and "requeue 42" in scontrol and rc == 0, out
