"""nemo-azr-launch: SLURM launcher (see issue on SLURM launching)."""
