"""`down`: stop exactly the Ray processes this cluster's `up` started, and verify they are gone.

Processes are found by this cluster's --temp-dir in their command line (plus their children), so another
Ray on the same host — another user's, another cluster's — is never touched. `ray stop` would kill them all;
it is offered only as `force`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.nodes.agent import Node, cluster_nodes
from verl_cluster.runners import fan_out


@dataclass
class DownOutcome:
    host: str
    role: str
    stopped: int = 0
    left: list[int] = field(default_factory=list)
    error: str = ""
    kinds: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error and not self.left

    def to_json(self) -> dict:
        return {"host": self.host, "role": self.role, "stopped": self.stopped, "left": self.left,
                "error": self.error, "ok": self.ok, "kinds": self.kinds}


def down(spec: ClusterSpec, *, force: bool = False) -> list[DownOutcome]:
    nodes = cluster_nodes(spec)
    # workers first, so they do not spend their last seconds reconnecting to a vanished head
    order = nodes[1:] + nodes[:1]

    def stop(n: Node) -> dict:
        if force:
            res = n.runner.run([spec.ray_executable(n.node), "stop", "--force"], timeout=60)
            return {"stopped": -1, "left": [], "kinds": ["ray stop --force"], "rc": res.rc, "tail": res.tail(5)}
        return n.kill()

    results = []
    try:
        for r in fan_out(order[:-1], stop, key=lambda n: n.host) + fan_out(order[-1:], stop, key=lambda n: n.host):
            node = next(n for n in nodes if n.host == r.host)
            o = DownOutcome(r.host, node.role)
            if r.ok:
                o.stopped, o.left, o.kinds = r.value["stopped"], r.value["left"], r.value["kinds"]
                if r.value.get("rc"):
                    o.error = f"ray stop failed: {r.value['tail']}"
            else:
                o.error = r.reason
            results.append(o)
    finally:
        for n in nodes:
            n.close()
    rank = {n.host: i for i, n in enumerate(nodes)}
    return sorted(results, key=lambda o: rank[o.host])
