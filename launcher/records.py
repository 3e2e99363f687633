"""One log folder per submission: the sbatch script, the resolved config(s), the job ids and Slurm output.

``<cluster.log_dir>/<job name>-<YYYYmmdd-HHMMSS>-<4 hex>/``:
``job.sbatch`` (exactly what was submitted), ``config.yaml`` (``config_<i>.yaml`` per array task),
``submission.json`` (job ids, chain links, override sets, sbatch commands) and the ``slurm-*.out``
files Slurm writes there. The folder is made before ``sbatch``, because Slurm opens ``--output``
inside it, so the job id is recorded afterwards.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path

SUBMISSION_FILE = "submission.json"
SCRIPT_FILE = "job.sbatch"


def new_log_folder(log_dir: str, job_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path(log_dir) / f"{job_name}-{stamp}-{secrets.token_hex(2)}").resolve()


def write_submission(folder: Path, record: dict) -> None:
    tmp = folder / f".{SUBMISSION_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(folder / SUBMISSION_FILE)  # readers never see half a file


def read_submission(folder: Path) -> dict:
    return json.loads((folder / SUBMISSION_FILE).read_text())


def submissions(log_dir: str | Path) -> list[Path]:
    """Submission folders under ``log_dir``, oldest first."""
    root = Path(log_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if (p / SUBMISSION_FILE).is_file()]
    return sorted(found, key=lambda p: (p / SUBMISSION_FILE).stat().st_mtime)


def base_id(job_id: str) -> str:
    """``123_4`` (an array task) -> ``123``; ``123`` -> ``123``."""
    return job_id.split("_", 1)[0]


def find_submission(log_dir: str | Path, job_id: str) -> Path | None:
    """The folder whose submission holds ``job_id`` (a chain link, an array job or one of its tasks)."""
    for folder in reversed(submissions(log_dir)):
        if base_id(job_id) in read_submission(folder).get("job_ids", []):
            return folder
    return None


def output_files(folder: Path, job_id: str) -> list[Path]:
    """The Slurm output files of ``job_id`` in its folder (every task of an array job)."""
    if "_" in job_id:
        patterns = [f"slurm-{job_id}.out"]
    else:
        patterns = [f"slurm-{job_id}.out", f"slurm-{job_id}_*.out"]
    files: list[Path] = []
    for pattern in patterns:
        files += sorted(folder.glob(pattern), key=_task_order)
    return files


def job_exit_status(folder: Path, job_id: str) -> int | None:
    """The status the batch script of ``job_id`` last ended with, from the line its EXIT trap prints
    (slurm/job.sbatch.tmpl); None when it never ended on its own (killed)."""
    status = None
    for path in output_files(folder, job_id)[:1]:  # the job's own file (an array job id: not its tasks')
        for found in _EXIT_LINE.finditer(path.read_text(errors="replace")):
            status = int(found.group(1))  # a requeued job appends to its file: the last one counts
    return status


#: what the batch script's EXIT trap prints (an array task's own job id differs from ``123_4``)
_EXIT_LINE = re.compile(r"^nemo-azr-launch: job \d+ exits with status (\d+)$", re.M)


def _task_order(path: Path) -> tuple[int, str]:
    tail = path.stem.rsplit("_", 1)[-1]
    return (int(tail), "") if tail.isdigit() else (-1, path.name)
