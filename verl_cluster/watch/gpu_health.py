"""GPU faults as the nodes themselves see them: NVML (a GPU gone, uncorrected ECC) and the kernel's Xid lines,
read through the node script on each node of the run when an attempt fails or hangs."""

from __future__ import annotations

from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.nodes.agent import run_on_nodes
from verl_cluster.runners import HostResult


def judge(reports: list[HostResult]) -> Optional[tuple[str, str]]:
    """(node, evidence) for the first node with a GPU fault, else None. An unreachable node is not judged here
    (the node-lost check owns that)."""
    for r in reports:
        if not r.ok:
            continue
        found = list(r.value.get("faults") or []) + [f"kernel: {x.strip()}" for x in (r.value.get("xid") or [])[-3:]]
        if found:
            return r.host, "; ".join(found)[:600]
    return None


def gpu_fault(spec: ClusterSpec, since: float, expect: dict[str, int]) -> Optional[tuple[str, str]]:
    return judge(run_on_nodes(spec, "gpuhealth", lambda n: (str(int(since)), str(expect.get(n.ip, 0))), timeout=45))
