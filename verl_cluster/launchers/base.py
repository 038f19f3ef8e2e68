"""The launcher interface: how a cluster's nodes are reached, and how Ray is started, held, stopped and judged
alive there. One launcher is chosen per cluster from its config (`verl_cluster.launchers.launcher_for`); the rest
of the code asks it what to do, never which one it is."""

from __future__ import annotations

from typing import ClassVar, Mapping, Optional, Sequence

from verl_cluster.config.cluster import ClusterSpec, NodeSpec
from verl_cluster.runners.base import CommandRunner, Result
from verl_cluster.slurm.allocation import Allocation

Problem = tuple[str, str, str]  # (node, what, fix)


class Launcher:
    """Ray as a daemon: `ray start` returns once its processes run on their own, and `down` stops them by this
    cluster's temp dir (what every launcher's Ray carries, so stopping is the same for all)."""

    name: ClassVar[str]

    def __init__(self, spec: ClusterSpec):
        self.spec = spec

    @staticmethod
    def prepare(data: dict, source: str) -> dict:
        """The raw cluster config, completed before it is validated (a launcher that finds its nodes fills them)."""
        return data

    @staticmethod
    def allocation(data: dict) -> Optional[Allocation]:
        """The batch system's allocation the raw config's nodes come from; None when the config lists them."""
        return None

    def runner(self, node: NodeSpec) -> CommandRunner:
        """How commands reach this node."""
        raise NotImplementedError

    def start_flags(self) -> list[str]:
        """Added to every node's `ray start`."""
        return []

    def start_ray(self, runner: CommandRunner, argv: Sequence[str], *, env: Mapping[str, str],
                  timeout: float) -> Result:
        """Run `ray start` on the node; returns once Ray runs there (or failed)."""
        return runner.run(list(argv), env=env, timeout=timeout)

    def via(self, node: NodeSpec) -> list[str]:
        """The command line `ray start` is wrapped in to reach the node, for --dry-run ([] when it runs as is)."""
        return []

    def running(self, role: str, raylet: bool, gcs: bool) -> bool:
        """Ray on a node counts as running: its raylet, and on the head the GCS too."""
        return raylet and (gcs or role != "head")

    def node_problems(self) -> list[Problem]:
        """What makes a node whose Ray runs unsafe to count on (for status and check)."""
        return []
