"""Runners: one protocol to run argv on a host, locally or over SSH."""

from __future__ import annotations

from verl_cluster.runners.base import CommandRunner, CommandTimeout, HostResult, Result, fan_out  # noqa: F401
from verl_cluster.runners.local import LocalRunner  # noqa: F401
from verl_cluster.runners.ssh import SshRunner, SshTarget  # noqa: F401


def runner_for(spec, node) -> CommandRunner:
    """The runner for one node of a ClusterSpec, as the cluster's launcher reaches it."""
    from verl_cluster.launchers import launcher_for  # the launchers build on the runners above

    return launcher_for(spec).runner(node)
