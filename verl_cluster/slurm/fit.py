"""Does a job fit what Slurm gives (or is asked for)? Nodes and GPUs per node, before any GPU time is spent."""

from __future__ import annotations

from typing import Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.config.job_shape import JobShape
from verl_cluster.errors import ConfigError


def check_fits(job: JobSpec, nodes: int, gpus_per_node: Optional[int], gpus_requested: bool, where: str) -> None:
    """ConfigError (one line + the fix) when the allocation (or the request) is short for the job."""
    shape = JobShape.of(job)
    want_nodes, want_gpus, needs = shape.nodes, shape.gpus_per_node, shape.needs_gpus
    if want_nodes and nodes < want_nodes:
        raise ConfigError(f"{where} has {nodes} node(s), but job {job.name} needs {want_nodes}",
                          f"ask for {want_nodes}: salloc/sbatch --nodes={want_nodes} (or verl-cluster sbatch "
                          f"--nodes {want_nodes}), or lower trainer.nnodes")
    if needs and not gpus_requested:
        g = want_gpus or 8
        raise ConfigError(f"{where} has no GPUs, but job {job.name} runs on GPUs",
                          f"request them: --gpus-per-node={g} (or --gres=gpu:{g}) with salloc/sbatch, "
                          f"or verl-cluster sbatch --gpus-per-node {g}")
    if want_gpus and gpus_per_node is not None and gpus_per_node < want_gpus:
        raise ConfigError(f"{where} has {gpus_per_node} GPU(s) per node, but job {job.name} needs {want_gpus}",
                          f"request --gpus-per-node={want_gpus}, or lower trainer.n_gpus_per_node")
