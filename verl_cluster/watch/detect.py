"""What the watcher looks at: the GCS's node table and the workers' raylet ports (node lost), and the job's log
(progress, hang). Everything is read through Ray (its GCS on the head, its Jobs API): no agent of our own."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import RunnerError
from verl_cluster.lifecycle.auth import node_token_path
from verl_cluster.lifecycle.nodes import Node, index_by_ip
from verl_cluster.watch.progress import Progress



def _refused(ip: str, port: int, timeout: float = 1.0) -> bool:
    """True only for a refused connection: the host answers but nothing listens (its raylet is gone). A timeout
    proves nothing (a firewall between us and the node looks the same)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class NodeMonitor:
    """Which of the nodes a run started on have left the cluster, with the evidence."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.head = Node(spec, "head", spec.head)
        self.token: Optional[str] = None
        self.refusals: dict[str, int] = {}

    def _gcs_nodes(self) -> dict[str, dict]:
        return index_by_ip(self._gcs_table(), self.spec.head_ip)

    def _gcs_table(self) -> list[dict]:
        if self.token is None and self.spec.security.auth == "token":
            self.token = node_token_path(self.spec, self.head.probe().home)
        return self.head.gcs(token_path=self.token).get("nodes", [])

    def alive_ips(self) -> set[str]:
        """Addresses of the configured nodes the GCS has alive now."""
        by_ip = self._gcs_nodes()
        return {ip for ip, x in by_ip.items() if x["alive"]}

    def gpus_by_ip(self) -> dict[str, int]:
        """GPUs each alive node registered with (what NVML should still see there)."""
        return {ip: int(x.get("resources", {}).get("GPU", 0)) for ip, x in self._gcs_nodes().items() if x["alive"]}

    def stale(self, gone: frozenset[str] = frozenset()) -> list[str]:
        """Addresses the GCS still lists alive by mistake: twice (a node restarted after its host died, whose old
        registration the GCS has not yet marked dead — its health check takes a while), or at all for a node
        known to be gone. A job started now could place work on the dead registration."""
        seen: dict[str, int] = {}
        for x in self._gcs_table():
            if x["alive"]:
                seen[x["ip"]] = seen.get(x["ip"], 0) + 1
        return sorted(ip for ip, k in seen.items() if k > 1 or ip in gone)

    def lost(self, expected: set[str]) -> Optional[tuple[str, str]]:
        """(node, evidence) for one expected node that is gone, else None. The head itself unreachable is a lost
        head."""
        port = self.spec.ray.ports.node_manager
        for ip in sorted(expected - {self.spec.head_ip}):
            if _refused(ip, port):
                self.refusals[ip] = self.refusals.get(ip, 0) + 1
                if self.refusals[ip] >= 2:  # twice in a row: not a blip while a raylet restarts
                    return ip, f"raylet port {ip}:{port} refuses connections (the raylet or the host is gone)"
            else:
                self.refusals.pop(ip, None)
        try:
            by_ip = self._gcs_nodes()
        except RunnerError as e:
            return self.spec.head_ip, f"the head's GCS cannot be asked: {e.reason}"
        for ip in sorted(expected):
            x = by_ip.get(ip)
            if x is None or not x["alive"]:
                return ip, "the GCS marks this node dead" if x else "the GCS does not list this node"
        return None

    def close(self) -> None:
        self.head.close()


@dataclass
class LogTracker:
    """New log text since the last look, the training progress it shows (read once, as it arrives), and when the
    log last moved."""
    seen: int = 0
    last_change: float = field(default_factory=time.monotonic)
    tail: list[str] = field(default_factory=list)
    tail_lines: int = 40
    progress: Progress = field(default_factory=Progress)

    def update(self, text: str) -> str:
        """Feed the whole log (Ray's Jobs API returns it whole); returns the part not seen before."""
        if len(text) < self.seen:  # a log that started over: read it afresh
            self.seen, self.progress = 0, Progress()
        new = text[self.seen:]
        self.seen = len(text)
        if new:
            self.last_change = time.monotonic()
            self.tail = (self.tail + new.splitlines())[-self.tail_lines:]
            self.progress.feed(new)
        return new

    def quiet_for(self) -> float:
        return time.monotonic() - self.last_change
