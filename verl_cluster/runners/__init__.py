"""Runners: one protocol to run argv on a host, locally or over SSH."""

from __future__ import annotations

from verl_cluster.runners.base import CommandRunner, CommandTimeout, HostResult, Result, fan_out  # noqa: F401
from verl_cluster.runners.local import LocalRunner  # noqa: F401
from verl_cluster.runners.ssh import SshRunner, SshTarget  # noqa: F401

