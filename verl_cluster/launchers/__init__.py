"""Launchers: one per cluster, chosen once from its config — local, SSH or Slurm.

A launcher owns how commands reach a node (its runner), how Ray is started and held there, and what makes a running
node unsafe to count on (verl_cluster/launchers/base.py). The shape follows Ray's NodeProvider (a provider hands out
each node's command runner and completes the config) and SkyPilot's provision layer (one module per provider behind
one set of calls, routed by the provider's name in one place).
"""

from __future__ import annotations

import os

from verl_cluster.config.cluster import ClusterSpec, NodeSpec
from verl_cluster.config.cluster import load_cluster as _load_cluster
from verl_cluster.config.job import JobSpec
from verl_cluster.config.loader import read_yaml
from verl_cluster.launchers.base import Launcher
from verl_cluster.launchers.slurm import SlurmLauncher
from verl_cluster.launchers.ssh import LocalLauncher, SshLauncher
from verl_cluster.runners.base import CommandRunner
from verl_cluster.slurm.fit import check_fits
from verl_cluster.slurm.spec import cluster_file as slurm_cluster_file

_BY_NAME: dict[str, type[Launcher]] = {"ssh": SshLauncher, "slurm": SlurmLauncher}  # config's `launcher:` values


def launcher_class(data: dict) -> type[Launcher]:
    """The launcher a raw cluster config names (an unknown name is left for the schema check to report)."""
    return _BY_NAME.get(str(data.get("launcher") or "ssh"), SshLauncher)


def launcher_for(spec: ClusterSpec) -> Launcher:
    """The cluster's launcher: the one its config names, local when an SSH cluster's every node is this machine."""
    cls = _BY_NAME[spec.launcher]
    if cls is SshLauncher and all(n.is_local for _, n in spec.nodes()):
        cls = LocalLauncher
    return cls(spec)


def runner_for(spec: ClusterSpec, node: NodeSpec) -> CommandRunner:
    """How commands reach one node of the cluster: its launcher's runner."""
    return launcher_for(spec).runner(node)


def _prepare(data: dict, source: str) -> dict:
    return launcher_class(data).prepare(data, source)


def load_cluster(path: str | os.PathLike, overrides: list[str] | None = None) -> ClusterSpec:
    """Parse and validate a cluster.yaml, its nodes completed by its launcher (a Slurm allocation's)."""
    return _load_cluster(path, overrides, prepare=_prepare)


def allocation_cluster(cluster_file: str | None) -> tuple[str, str]:
    """`--slurm`: the cluster file (with none given, one written for this allocation) and the override that
    makes its launcher Slurm's."""
    return cluster_file or slurm_cluster_file(), "launcher=slurm"


def check_job_fits(job: JobSpec, cluster_file: str) -> None:
    """For `submit`: a job against the allocation its cluster's nodes come from (enough nodes, GPUs requested);
    nothing to check when the cluster file lists its nodes."""
    data, _ = read_yaml(cluster_file)
    alloc = launcher_class(data).allocation(data) if isinstance(data, dict) else None
    if alloc is not None:
        check_fits(job, len(alloc.nodes), alloc.head.gpus if alloc.nodes else None, alloc.gpus_requested,
                   f"Slurm allocation {alloc.job_id}")
