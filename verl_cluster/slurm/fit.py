"""Does a job fit what Slurm gives (or is asked for)? Nodes and GPUs per node, before any GPU time is spent."""

from __future__ import annotations

import re
from typing import Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.errors import ConfigError


def _int(v) -> Optional[int]:
    try:
        return int(v) if v is not None and str(v).strip() != "" else None
    except (TypeError, ValueError):
        return None


def job_shape(job: JobSpec) -> tuple[Optional[int], Optional[int], bool]:
    """(nodes, GPUs per node, needs GPUs) as the job states them: trainer.nnodes / trainer.n_gpus_per_node,
    else placement.gpus (`2x8xH100-80GB`). verl's trainers (main_ppo, ...) need GPUs even when unstated."""
    nodes, gpus = _int(job.get("trainer.nnodes")), _int(job.get("trainer.n_gpus_per_node"))
    m = re.match(r"^\s*(\d+)\s*x\s*(\d+)\s*x", job.placement.gpus or "")
    if m:
        nodes = nodes if nodes is not None else int(m.group(1))
        gpus = gpus if gpus is not None else int(m.group(2))
    needs = bool(gpus) or (job.is_ray_only and gpus != 0)
    return nodes, gpus, needs


def check_fits(job: JobSpec, nodes: int, gpus_per_node: Optional[int], gpus_requested: bool, where: str) -> None:
    """ConfigError (one line + the fix) when the allocation (or the request) is short for the job."""
    want_nodes, want_gpus, needs = job_shape(job)
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
