"""Runners: one protocol to run argv on a host, locally or over SSH."""

from __future__ import annotations

from verl_cluster.runners.base import CommandRunner, CommandTimeout, HostResult, Result, fan_out  # noqa: F401
from verl_cluster.runners.local import LocalRunner
from verl_cluster.runners.ssh import SshRunner, SshTarget


def runner_for(spec, node) -> CommandRunner:
    """The runner for one node of a ClusterSpec: srun for launcher slurm, local for localhost, SSH otherwise."""
    if getattr(spec, "launcher", "ssh") == "slurm":
        from verl_cluster.slurm.runner import SlurmRunner

        s = spec.slurm
        return SlurmRunner(node.host, s.job_id, srun=s.srun, extra_args=s.srun_args, cpus=node.cpus,
                           log_dir=s.log_dir)
    if node.is_local:
        return LocalRunner(node.host)
    s = spec.ssh
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
