"""Slurm: nodes from an allocation, commands through srun, batch scripts."""
