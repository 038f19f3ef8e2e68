"""Slurm: nodes from an allocation, commands through srun, batch scripts (issue 11)."""
