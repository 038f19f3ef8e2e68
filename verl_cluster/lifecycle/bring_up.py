"""Bringing a cluster up the one way: the backend environment (NCCL/Gloo/UCX interface choice, as `check` makes it)
first, then `up` with it on every node. The CLI's `up` and `watch`'s heal both call this, so a node restarted by
a heal comes back with the same NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME as after `up`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.lifecycle.up import UpReport, up


@dataclass
class BringUp:
    report: UpReport
    reasons: list[str] = field(default_factory=list)  # why each backend setting was chosen


def bring_up(spec: ClusterSpec, *, restart: bool = False,
             progress: Optional[Callable[[str, str], None]] = None) -> BringUp:
    """Start or heal every node with the backend environment; the environment is remembered for an hour per
    cluster (`restart` detects it again). Unreachable nodes are skipped by the detection: `up` reports them
    itself."""
    from verl_cluster.diagnostics.env_cache import cached_backend_env

    env = cached_backend_env(spec, refresh=restart)
    report = up(spec, restart=restart, node_env=env.by_host, progress=progress)
    return BringUp(report, list(env.reasons) + list(env.notes))
