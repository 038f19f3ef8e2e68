"""Bringing a cluster up the one way: the backend environment (NCCL/Gloo/UCX interface choice, as `check` makes it)
first, then `up` with it on every node. The CLI's `up`, the batch script's `up` and `watch`'s heal all call this, so
a node restarted by a heal comes back with the same NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME as after `up`. The quick
check after a (re)start is the caller's step (`BringUp.quick_check`): the CLI's `up` takes it, a heal does not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.launchers import launcher_for
from verl_cluster.nodes.auth import refuse_open_dashboard
from verl_cluster.lifecycle.commands import NodeCommand, plan_start
from verl_cluster.lifecycle.up import NodeAction, UpReport, up

if TYPE_CHECKING:
    from verl_cluster.diagnostics.check import CheckReport


@dataclass(frozen=True)
class PlannedNode:
    command: NodeCommand
    via: list[str] = field(default_factory=list)  # what the launcher wraps `ray start` in to reach the node


def plan(spec: ClusterSpec) -> list[PlannedNode]:
    """What `up` would run on each node, head first (--dry-run); a cluster `up` refuses is refused here already.
    The backend environment from `check` is added at `up` time."""
    refuse_open_dashboard(spec)
    launcher = launcher_for(spec)
    return [PlannedNode(cmd, launcher.via(node)) for cmd, (_, node) in zip(plan_start(spec), spec.nodes())]


@dataclass
class BringUp:
    spec: ClusterSpec
    report: UpReport
    reasons: list[str] = field(default_factory=list)  # why each backend setting was chosen
    check: Optional["CheckReport"] = None

    @property
    def needs_check(self) -> bool:
        """A healthy cluster where something was (re)started; one that was only verified was checked before."""
        return self.report.healthy and any(n.action != NodeAction.KEPT for n in self.report.nodes)

    def quick_check(self) -> Optional["CheckReport"]:
        """`check --quick` (ports between nodes, versions, GPUs) when `needs_check`; the report, or None."""
        from verl_cluster.diagnostics.check import run_check

        if self.needs_check:
            self.check = run_check(self.spec, quick=True)
        return self.check

    @property
    def healthy(self) -> bool:
        return self.report.healthy and (self.check is None or self.check.ok)


def bring_up(spec: ClusterSpec, *, restart: bool = False,
             progress: Optional[Callable[[str, str], None]] = None) -> BringUp:
    """Start or heal every node with the backend environment; the environment is remembered for an hour per
    cluster (`restart` detects it again). Unreachable nodes are skipped by the detection: `up` reports them
    itself. The quick check is the caller's next step (`BringUp.quick_check`)."""
    from verl_cluster.diagnostics.env_cache import cached_backend_env

    env = cached_backend_env(spec, refresh=restart)
    report = up(spec, restart=restart, node_env=env.by_host, progress=progress)
    return BringUp(spec, report, list(env.reasons) + list(env.notes))
