"""`nemo-azr-launch status` reports a cancelled job's real exit code. Slurm's job-completion file
writes a cancelled job's line when the cancel lands, before the batch script exits (measured on
Slurm 22.05: the file says ExitCode=0:0 where ``scontrol show job`` says 75:0), so once scontrol has
forgotten the job the status is read from the script's own output."""

from __future__ import annotations

from nemo_azr_launch import cli, records, slurm


def _submission(log_dir, job_id: str, output: str):
    folder = log_dir / f"train-{job_id}"
    folder.mkdir(parents=True)
    records.write_submission(folder, {"job_ids": [job_id]})
    (folder / f"slurm-{job_id}.out").write_text(output)
    return folder


def _status_rows(capsys, log_dir, states, monkeypatch) -> dict[str, list[str]]:
    monkeypatch.setattr(slurm, "job_states", lambda ids: states)
    assert cli.main(["status", "--log-dir", str(log_dir), *[s.job_id for s in states]]) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line.split()[0]: line.split(None, 4) for line in lines[1:]}


def test_a_cancelled_job_from_the_jobcomp_file_shows_the_status_its_script_printed(
    tmp_path, capsys, monkeypatch
):
    _submission(
        tmp_path,
        "7",
        "nemo-azr-launch: job 7 restart 0 on vm\n"
        "nemo-azr-launch: training exited with status 75\n"
        "nemo-azr-launch: newest checkpoint /o/step_4; requeueing job 7\n"
        "nemo-azr-launch: job 7 exits with status 0\n"  # a first run, requeued
        "nemo-azr-launch: job 7 restart 1 on vm\n"
        "nemo-azr-launch: got SIGTERM, forwarding it to the training processes\n"
        "nemo-azr-launch: training exited with status 75\n"
        "nemo-azr-launch: SIGTERM reached job 7 (scancel ...); not requeueing\n"
        "nemo-azr-launch: job 7 exits with status 75\n",
    )
    _submission(tmp_path, "8", "nemo-azr-launch: job 8 restart 0 on vm\n")  # killed before it ended
    states = [
        slurm.JobState("7", "train", "CANCELLED", "0:0", "jobcomp"),
        slurm.JobState("8", "train", "CANCELLED", "0:0", "jobcomp"),
        slurm.JobState("9", "train", "COMPLETED", "0:0", "jobcomp"),  # not a cancel: the file's code
        slurm.JobState("10", "train", "CANCELLED", "75:0", "scontrol"),  # scontrol knows it
    ]
    rows = _status_rows(capsys, tmp_path, states, monkeypatch)
    assert rows["7"][3:] == ["75:0", "jobcomp + job output"]
    assert rows["8"][3:] == ["?", "jobcomp (no exit code for a cancel)"]
    assert rows["9"][3:] == ["0:0", "jobcomp"]
    assert rows["10"][3:] == ["75:0", "scontrol"]


def test_job_exit_status_reads_the_last_run_of_a_requeued_job(tmp_path):
    folder = _submission(
        tmp_path,
        "5",
        "nemo-azr-launch: job 5 exits with status 0\nnemo-azr-launch: job 5 exits with status 75\n",
    )
    assert records.job_exit_status(folder, "5") == 75
    assert records.job_exit_status(folder, "6") is None  # no output file
