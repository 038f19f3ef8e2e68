"""GPU faults as the nodes themselves see them: NVML (a GPU gone, uncorrected ECC) and the kernel's Xid lines,
read through the node script on each node of the run when an attempt fails or hangs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import RunnerError
from verl_cluster.lifecycle.nodes import cluster_nodes


def _one(node, since: float, expect: int) -> dict:
    try:
        return {"ip": node.ip, **node.script("gpuhealth", str(int(since)), str(expect), timeout=45)}
    except RunnerError as e:
        return {"ip": node.ip, "error": e.reason}
    finally:
        node.close()


def judge(reports: list[dict]) -> Optional[tuple[str, str]]:
    """(node, evidence) for the first node with a GPU fault, else None. An unreachable node is not judged here
    (the node-lost check owns that)."""
    for r in reports:
        found = list(r.get("faults") or []) + [f"kernel: {x.strip()}" for x in (r.get("xid") or [])[-3:]]
        if found:
            return r["ip"], "; ".join(found)[:600]
    return None


def gpu_fault(spec: ClusterSpec, since: float, expect: dict[str, int]) -> Optional[tuple[str, str]]:
    nodes = cluster_nodes(spec)
    with ThreadPoolExecutor(max_workers=len(nodes)) as ex:
        reports = list(ex.map(lambda n: _one(n, since, expect.get(n.ip, 0)), nodes))
    return judge(reports)
