"""launcher: slurm — the nodes are the allocation's, commands reach them as job steps (`srun --overlap`), and Ray
is held by one `srun ... ray start --block` step per node, so the allocation's end (or `down`) ends it."""

from __future__ import annotations

from typing import Mapping, Sequence

from verl_cluster.config.cluster import NodeSpec
from verl_cluster.errors import ConfigError
from verl_cluster.launchers.base import Launcher, Problem
from verl_cluster.runners.base import CommandRunner, Result
from verl_cluster.slurm import allocation as alloc
from verl_cluster.slurm.runner import SlurmRunner
from verl_cluster.slurm.spec import fill


class SlurmLauncher(Launcher):
    name = "slurm"

    @staticmethod
    def prepare(data: dict, source: str) -> dict:
        return fill(data, source)

    @staticmethod
    def allocation(data: dict) -> alloc.Allocation:
        return alloc.read_allocation(job_id=(data.get("slurm") or {}).get("job_id"))

    def runner(self, node: NodeSpec) -> SlurmRunner:
        s = self.spec.slurm
        return SlurmRunner(node.host, s.job_id, srun=s.srun, extra_args=s.srun_args, cpus=node.cpus,
                           log_dir=s.log_dir)

    def start_flags(self) -> list[str]:
        # a daemonised `ray start` escapes the step under proctrack/linuxproc and outlives the allocation:
        # it stays in the foreground, held by its own step (verl_cluster/slurm/runner.py)
        return ["--block"]

    def start_ray(self, runner: CommandRunner, argv: Sequence[str], *, env: Mapping[str, str],
                  timeout: float) -> Result:
        return runner.run_held(list(argv), env=env, timeout=timeout)  # the runner this launcher gave: a SlurmRunner

    def via(self, node: NodeSpec) -> list[str]:
        argv = self.runner(node).srun_argv([], held=True)
        return argv[:argv.index("--")]

    def node_problems(self, run: alloc.Run | None = None) -> list[Problem]:
        """Nodes Slurm has drained or marked down: still in this allocation, until they are not."""
        names = [n.host for _, n in self.spec.nodes()]
        try:
            states = alloc.node_states(names, run) if run else alloc.node_states(names)
        except ConfigError as e:
            return [("slurm", f"node states unavailable: {e.message}", e.hint or "")]
        out = []
        for name in names:
            s = states.get(name)
            if s and s.drained:
                why = f" ({s.reason})" if s.reason else ""
                out.append((name, f"Slurm marks it {s.state}{why}: it stays in this allocation but may fail or be "
                                  "taken away at the job's end",
                            f"finish or checkpoint the run; ask the admins, or exclude it next time: --exclude={name}"))
        return out
