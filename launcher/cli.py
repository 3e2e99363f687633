"""``nemo-azr-launch``: submit training to SLURM and follow it.

    nemo-azr-launch submit [--dry-run] [--chain N] [-m] OVERRIDE...   # Hydra overrides, cluster.* included
    nemo-azr-launch status [JOBID...]                                 # default: the recent submissions
    nemo-azr-launch logs JOBID [--tail N]
    nemo-azr-launch cancel JOBID... [--all] [--signal USR1]

User-facing problems print one ``nemo-azr-launch: error: ...`` line and exit with status 2, before
anything is submitted. ``--dry-run`` runs no Slurm command at all: the script may be for another
cluster, so the partition is checked against ``sinfo`` only when submitting.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nemo_azr.errors import run_reporting_errors
from nemo_azr_launch import records, slurm
from nemo_azr_launch.errors import LaunchError
from nemo_azr_launch.render import render_script
from nemo_azr_launch.spec import JobSpec, build_spec, check_partition

DEFAULT_LOG_DIR = "slurm_logs"  # cluster.log_dir's default
RECENT = 10  # submissions `status` shows without job ids


def _write_folder(spec: JobSpec, folder: Path, script: str) -> Path:
    from nemo_azr.config.loader import to_yaml

    folder.mkdir(parents=True, exist_ok=False)
    path = folder / records.SCRIPT_FILE
    path.write_text(script)
    path.chmod(0o755)
    if spec.is_array:
        for i, cfg in enumerate(spec.configs):
            (folder / f"config_{i}.yaml").write_text(to_yaml(cfg))
    else:
        (folder / "config.yaml").write_text(to_yaml(spec.cfg))
    return path


def _submit(args: argparse.Namespace) -> int:
    spec = build_spec(args.overrides, multirun=args.multirun, chain=args.chain)
    workdir = str(Path.cwd())
    folder = records.new_log_folder(spec.cluster.log_dir, spec.cluster.job_name or spec.cfg.experiment_name)
    script = render_script(spec, folder, workdir, max_parallel=args.max_parallel)
    if args.dry_run:  # no Slurm command: this machine's own cluster may not be the target
        print(script, end="")
        deps = [""] + [f"afterany:<job id of link {i}>" for i in range(1, spec.chain)]
        for dep in deps:
            print("# submit: " + " ".join(slurm.sbatch_command(folder / records.SCRIPT_FILE, dependency=dep)))
        return 0
    if slurm.run(["sbatch", "--version"]) is None:
        raise LaunchError("sbatch not found: run this on a Slurm login node (or use --dry-run)")
    check_partition(spec.cluster, slurm.partitions)
    path = _write_folder(spec, folder, script)
    record = {
        "job_ids": [],
        "chain": spec.chain,
        "array_tasks": len(spec.override_sets) if spec.is_array else 0,
        "override_sets": spec.override_sets,
        "workdir": workdir,
        "output_dirs": [c.trainer.output_dir for c in spec.configs],
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "sbatch": [],
    }
    prev = ""
    for _link in range(spec.chain):
        dep = f"afterany:{prev}" if prev else ""
        prev = slurm.submit(path, dependency=dep)
        record["job_ids"].append(prev)
        record["sbatch"].append(slurm.sbatch_command(path, dependency=dep))
        records.write_submission(folder, record)  # after each link: a failure later still leaves a record
    kind = (
        f"chain of {spec.chain}"
        if spec.chain > 1
        else f"array of {len(spec.override_sets)}"
        if spec.is_array
        else "job"
    )
    print(f"submitted {kind}: {' '.join(record['job_ids'])}; logs in {folder}")
    return 0


def _status(args: argparse.Namespace) -> int:
    ids = list(args.job_ids)
    if not ids:
        for folder in records.submissions(args.log_dir)[-RECENT:]:
            ids += records.read_submission(folder).get("job_ids", [])
    if not ids:
        print(f"no job ids given and no submissions under {args.log_dir}")
        return 0
    rows = [("JOBID", "NAME", "STATE", "EXIT", "SOURCE")]
    rows += [(s.job_id, s.name, s.state, *_exit_and_source(s, args.log_dir)) for s in slurm.job_states(ids)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0


def _exit_and_source(state: slurm.JobState, log_dir: str) -> tuple[str, str]:
    """The job's exit code and where it came from. Slurm's job-completion file writes a cancelled
    job's line when the cancel lands, before the batch script exits, so its ``0:0`` is not the
    job's status: the script's own output says what it ended with."""
    if state.source != "jobcomp" or not state.state.startswith("CANCELLED"):
        return state.exit_code, state.source
    folder = records.find_submission(log_dir, state.job_id)
    status = records.job_exit_status(folder, state.job_id) if folder else None
    if status is None:
        return "?", "jobcomp (no exit code for a cancel)"
    return f"{status}:0", "jobcomp + job output"


def _logs(args: argparse.Namespace) -> int:
    folder = records.find_submission(args.log_dir, args.job_id)
    files = records.output_files(folder, args.job_id) if folder else []
    if not files:
        path = slurm.stdout_path(args.job_id)
        files = [path] if path and path.is_file() else []
    if not files:
        where = f"in {folder}" if folder else f"under {args.log_dir} or from scontrol"
        raise LaunchError(f"no output of job {args.job_id} {where} (not started yet, or another --log-dir?)")
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        if len(files) > 1:
            print(f"==> {path} <==")
        print("\n".join(lines[-args.tail :] if args.tail else lines))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    ids = list(args.job_ids)
    if args.all:  # every link of the chain / the whole array the ids belong to
        for job_id in args.job_ids:
            folder = records.find_submission(args.log_dir, job_id)
            if folder:
                ids += [j for j in records.read_submission(folder)["job_ids"] if j not in ids]
    refused = slurm.cancel(ids, signal=args.signal)
    print(("signalled " if args.signal else "cancelled ") + " ".join(ids))
    for job_id, why in refused.items():
        print(
            f"nemo-azr-launch: warning: could not set Requeue=0 on job {job_id} ({why}); "
            "if it was still running, it may requeue itself after its checkpoint",
            file=sys.stderr,
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nemo-azr-launch",
        description="Submit nemo-azr training to SLURM (sbatch rendered from the Hydra config) and follow it.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("submit", help="render the sbatch script from the config and submit it")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, cluster.* included (cluster=local ...)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the script and sbatch commands; submit nothing and ask no Slurm command (sinfo)",
    )
    p.add_argument("--chain", type=int, default=1, help="N jobs linked by afterany, each resuming the last")
    p.add_argument(
        "-m", "--multirun", action="store_true", help="sweep (a=1,2 b=x,y) -> one array task per setting"
    )
    p.add_argument("--max-parallel", type=int, default=0, help="array tasks running at once (0: no limit)")
    p.set_defaults(fn=_submit)
    for name, fn, help_text in (
        ("status", _status, "job states (sacct, else squeue / jobcomp file / scontrol)"),
        ("logs", _logs, "print a job's Slurm output"),
        ("cancel", _cancel, "cancel jobs for good (no requeue), or signal them"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == "logs":
            p.add_argument("job_id")
            p.add_argument("--tail", type=int, default=0, help="last N lines only")
        else:
            p.add_argument("job_ids", nargs="*" if name == "status" else "+")
        if name == "cancel":
            p.add_argument(
                "--all", action="store_true", help="also the other links / tasks of the submission"
            )
            p.add_argument(
                "--signal",
                default="",
                help="send this signal to the batch shell instead (e.g. USR1: checkpoint + requeue)",
            )
        p.add_argument("--log-dir", default=DEFAULT_LOG_DIR, help="cluster.log_dir of the submissions")
        p.set_defaults(fn=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run_reporting_errors("nemo-azr-launch", args.fn, args)


if __name__ == "__main__":
    sys.exit(main())
