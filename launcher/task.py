"""One training rank under ``srun`` (``cluster.launcher=srun``): Slurm's task ids -> torch's env vars.

    srun --ntasks-per-node=N python -m nemo_azr_launch.task train OVERRIDE...

Sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` from ``SLURM_PROCID``/``SLURM_NTASKS``/
``SLURM_LOCALID``/``SLURM_NTASKS_PER_NODE`` (``MASTER_ADDR``/``MASTER_PORT`` come from the batch script)
and runs ``nemo-azr`` in this process, so SIGUSR1 from srun reaches the trainer directly and its exit
status (75 after a preemption checkpoint) is the task's.
"""

from __future__ import annotations

import os
import sys


def rank_env(environ: dict[str, str]) -> dict[str, str]:
    """torch.distributed's variables for this Slurm task; none for a one-task job, which then runs
    exactly like a local single-process run."""
    world = int(environ.get("SLURM_NTASKS", "1"))
    if world <= 1:
        return {}
    local_world = environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0].split(",")[0]
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": local_world or str(world),
    }


def main(argv: list[str] | None = None) -> int:
    os.environ.update(rank_env(dict(os.environ)))
    from nemo_azr.cli import main as nemo_azr_main

    return nemo_azr_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    from nemo_azr.cli import exit_process

    exit_process(main())
