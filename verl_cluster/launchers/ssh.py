"""Nodes on this machine (local) or reached over SSH; Ray runs there as a daemon."""

from __future__ import annotations

from verl_cluster.config.cluster import NodeSpec
from verl_cluster.launchers.base import Launcher
from verl_cluster.runners.base import CommandRunner
from verl_cluster.runners.local import LocalRunner
from verl_cluster.runners.ssh import SshRunner, SshTarget


class LocalLauncher(Launcher):
    """Every node is this machine: commands run as subprocesses."""

    name = "local"

    def runner(self, node: NodeSpec) -> CommandRunner:
        return LocalRunner(node.host)


class SshLauncher(LocalLauncher):
    """Nodes over SSH (paramiko); a node named localhost still runs here."""

    name = "ssh"

    def runner(self, node: NodeSpec) -> CommandRunner:
        if node.is_local:
            return super().runner(node)
        s = self.spec.ssh
        return SshRunner(SshTarget(
            host=node.host,
            port=node.ssh_port or s.port,
            user=node.ssh_user or s.user,
            key_file=node.ssh_key_file or s.key_file,
            known_hosts_file=s.known_hosts_file,
            connect_timeout_s=s.connect_timeout_s,
            keepalive_s=s.keepalive_s,
            accept_new_host_keys=s.accept_new_host_keys,
            use_ssh_config=s.use_ssh_config,
        ))
