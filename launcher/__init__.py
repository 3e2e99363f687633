"""``nemo-azr-launch``: render an sbatch script from the Hydra config, submit it, follow and cancel jobs.

Modules: ``spec`` (compose + validate the job), ``render`` (the batch script), ``slurm`` (the Slurm
commands and their fall-backs), ``records`` (one log folder per submission), ``cli``; and what runs
inside the job: ``task`` (one rank under srun) and ``torchrun_node`` (one torchrun per node).
"""
