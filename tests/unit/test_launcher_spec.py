"""Launcher checks before submission (one line, exit 2), sweep expansion, rank env, records."""

from __future__ import annotations

import json
import os

import pytest

from nemo_azr_launch import cli, records, slurm
from nemo_azr_launch.spec import expand_sweep, time_limit_s
from nemo_azr_launch.task import rank_env
from nemo_azr_launch.torchrun_node import exit_status

BASE = ["trainer.max_steps=3", "logger=quiet"]


@pytest.fixture
def partitions(monkeypatch):
    known = ["debug", "gpu"]
    monkeypatch.setattr(slurm, "partitions", lambda: known)
    return known


# A cluster that answers on this machine: every Slurm command records its call; sinfo lists the
# partitions debug and gpu; sbatch "submits" job 1234; the others succeed silently.
FAKE_SLURM_COMMAND = """#!/bin/bash
name=$(basename "$0")
echo "$name $*" >> "$FAKE_DIR/calls.log"
case "$name" in
    sinfo) printf 'debug\\ngpu\\n' ;;
    sbatch) if [ "$1" = --version ]; then echo "slurm 22.05.8"; else echo 1234; fi ;;
esac
exit 0
"""
SLURM_COMMANDS = ("sinfo", "sbatch", "squeue", "scontrol", "sacct", "scancel", "srun", "salloc")


@pytest.fixture
def answering_slurm(tmp_path, monkeypatch):
    """Fake Slurm commands first on PATH; yields the file that lists their calls."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name in SLURM_COMMANDS:
        (bin_dir / name).write_text(FAKE_SLURM_COMMAND)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return tmp_path / "calls.log"


def submit_error(capsys, tmp_path, *overrides: str, flags: tuple[str, ...] = ()) -> str:
    rc = cli.main(["submit", *flags, *overrides, f"cluster.log_dir={tmp_path / 'logs'}", *BASE])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert out == "" and not (tmp_path / "logs").exists()  # nothing rendered or submitted
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nemo-azr-launch: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.tasks_per_node=2"], "model.backend=hf trains in one process"),
        (
            ["model=megatron", "parallel=tp2pp1", "cluster.tasks_per_node=3"],
            "= 3 ranks, which tp 2 x pp 1 = 2 does not divide",
        ),
        (
            [
                "model=megatron",
                "parallel=tp2pp1",
                "parallel.data_parallel_size=2",
                "cluster.nodes=3",
                "cluster.tasks_per_node=2",
            ],
            "needs tp 2 x pp 1 x dp 2 = 4",
        ),
        (["cluster.gpus_per_node=8", "cluster.tasks_per_node=4"], "one rank per GPU"),
        (["cluster.time=10", "cluster.signal_margin_s=600"], "is not below cluster.time=10 (600 s)"),
        (["cluster.time=soon"], "cluster.time='soon' is not a Slurm time"),
        (["cluster.launcher=mpirun"], "cluster.launcher='mpirun' is not one of: srun, torchrun"),
        (
            ["cluster.container_mounts=[/a:/a]"],
            "container_mounts is set but cluster.container_image is empty",
        ),
        (["+cluster.env={BAD-NAME: x}"], "'BAD-NAME' is not a valid environment variable name"),
        (["cluster.nodez=2"], "unknown config key 'cluster.nodez': did you mean cluster.nodes?"),
        (["trainer.max_steps_per_run=-1"], "trainer.max_steps_per_run must be >= 0"),
    ],
)
def test_bad_cluster_configs_fail_before_submission(capsys, tmp_path, partitions, overrides, message):
    for flags in ((), ("--dry-run",)):
        assert message in submit_error(capsys, tmp_path, *overrides, flags=flags)


def test_chain_and_sweep_conflicts(capsys, tmp_path, partitions):
    assert "cannot be combined" in submit_error(capsys, tmp_path, "seed=0,1", flags=("-m", "--chain", "2"))
    assert "trainer.resume=auto" in submit_error(
        capsys, tmp_path, "trainer.resume=never", flags=("--chain", "2")
    )
    assert "must not change cluster" in submit_error(capsys, tmp_path, "cluster.time=10,20", flags=("-m",))
    assert "--chain must be >= 1" in submit_error(capsys, tmp_path, flags=("--chain", "0"))


def test_unknown_partition_fails_before_submission(capsys, tmp_path, answering_slurm):
    message = submit_error(capsys, tmp_path, "cluster.partition=nope")
    assert message.endswith("unknown partition cluster.partition='nope'; sinfo lists: debug, gpu")
    calls = answering_slurm.read_text().splitlines()
    assert "sinfo -h -o %R" in calls and not any(c.startswith("sbatch --parsable") for c in calls)


def test_known_partition_is_submitted(capsys, tmp_path, answering_slurm):
    logs = tmp_path / "logs"
    assert cli.main(["submit", "cluster.partition=gpu", f"cluster.log_dir={logs}", *BASE]) == 0
    assert capsys.readouterr().out.startswith("submitted job: 1234; logs in ")
    (folder,) = logs.iterdir()
    assert "#SBATCH --partition=gpu" in (folder / "job.sbatch").read_text()
    assert f"sbatch --parsable {folder / 'job.sbatch'}" in answering_slurm.read_text().splitlines()


def test_dry_run_for_another_cluster_asks_no_local_slurm(capsys, tmp_path, answering_slurm):
    """This machine's cluster answers (partitions debug, gpu); the script is for a site whose
    partition is 'batch'. The dry run prints it and runs no Slurm command at all."""
    args = ["cluster=gpu_8x", "model=megatron", "parallel=tp2pp1"]
    assert cli.main(["submit", "--dry-run", *args, f"cluster.log_dir={tmp_path / 'logs'}", *BASE]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "#SBATCH --partition=batch" in out and "#SBATCH --nodes=2" in out
    assert not answering_slurm.exists(), answering_slurm.read_text()  # not even sinfo
    assert not (tmp_path / "logs").exists()
    # The same without --dry-run asks this machine's sinfo, which does not know 'batch'.
    assert "sinfo lists: debug, gpu" in submit_error(capsys, tmp_path, *args)
    assert "sinfo -h -o %R" in answering_slurm.read_text().splitlines()


def test_submit_without_sbatch_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm commands at all
    assert "sbatch not found" in submit_error(capsys, tmp_path)


def test_expand_sweep():
    assert expand_sweep(["a=1", "b=x,y", "c=range(0,2)"]) == [
        ["a=1", "b=x", "c=0"],
        ["a=1", "b=x", "c=1"],
        ["a=1", "b=y", "c=0"],
        ["a=1", "b=y", "c=1"],
    ]
    assert expand_sweep(["+x=[1,2]", "s='p,q'"]) == [["+x=[1,2]", "s='p,q'"]]  # lists and quoted commas


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 1800),
        ("5:30", 330),
        ("01:00:00", 3600),
        ("2-0", 172800),
        ("1-2:30", 95400),
        ("1-00:00:10", 86410),
    ],
)
def test_time_limit(value, seconds):
    assert time_limit_s(value) == seconds


def test_rank_env():
    assert rank_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) == {}  # one task: the local code path
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2(x2)"}
    assert rank_env(env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


def test_torchrun_exit_status():
    assert exit_status([75, 75]) == 75
    assert exit_status([75]) == 75  # the others were stopped by the agent after the first exit
    assert exit_status([75, 1]) == 1 and exit_status([]) == 1
    assert exit_status([76, 76]) == 76  # peers lost: every failed worker said so
    assert exit_status([76, -9]) == 1 and exit_status([75, 76]) == 1


def test_records_find_jobs_and_outputs(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    for folder, ids in ((a, ["10", "11"]), (b, ["12"])):
        folder.mkdir()
        records.write_submission(folder, {"job_ids": ids})
    for name in ("slurm-12_1.out", "slurm-12_0.out", "slurm-12_10.out", "slurm-120.out"):
        (b / name).write_text("x")
    assert records.find_submission(tmp_path, "11") == a
    assert records.find_submission(tmp_path, "12_1") == b
    assert records.find_submission(tmp_path, "13") is None
    assert [p.name for p in records.output_files(b, "12")] == [
        "slurm-12_0.out",
        "slurm-12_1.out",
        "slurm-12_10.out",
    ]
    assert [p.name for p in records.output_files(b, "12_1")] == ["slurm-12_1.out"]
    assert json.loads((a / records.SUBMISSION_FILE).read_text()) == {"job_ids": ["10", "11"]}
