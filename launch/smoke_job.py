"""CPU-only smoke job: proves submit -> Ray job -> every node end to end, on any machine.

Runs one zero-CPU task pinned to each alive node and reports, per node: address, resources, and the backend
environment (NCCL_/GLOO_/UCX_/... values; other job variables by name only, so secrets never print).
Checks: at least SMOKE_MIN_NODES nodes, and every node sees the job's env_vars exactly. Exit 1 on a failed check.
"""

import json
import os
import socket
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

BACKEND_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "TP_SOCKET_", "MASTER_", "CUDA_", "VC_")


@ray.remote(num_cpus=0)
def probe(names):
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(), "env": {n: os.environ.get(n) for n in names}}


def main() -> int:
    ray.init(address="auto", logging_level="ERROR")
    job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(sorted(job_env)) for n in nodes]
    seen = ray.get(refs, timeout=120)
    report = {"nodes": [], "cluster_resources": ray.cluster_resources(), "problems": []}
    by_id = {n["NodeID"]: n for n in nodes}
    for s in seen:
        shown = {k: (v if k.startswith(BACKEND_PREFIXES) else ("<set>" if v is not None else None))
                 for k, v in s["env"].items()}
        report["nodes"].append({"ip": s["ip"], "hostname": s["hostname"],
                                "resources": by_id[s["node_id"]].get("Resources", {}), "env": shown})
        wrong = sorted(k for k, v in job_env.items() if s["env"].get(k) != v)
        if wrong:
            report["problems"].append(f"node {s['ip']} does not see the job env: {', '.join(wrong)}")
    want = int(os.environ.get("SMOKE_MIN_NODES", "1"))
    if len(seen) < want:
        report["problems"].append(f"only {len(seen)} nodes alive, wanted {want}")
    for n in report["nodes"]:
        res = ", ".join(f"{k}={v:g}" for k, v in sorted(n["resources"].items()) if not k.startswith("node:"))
        env = ", ".join(f"{k}={v}" for k, v in sorted(n["env"].items()))
        print(f"node {n['ip']} ({n['hostname']}): {res}; env: {env or '-'}")
    print("SMOKE-REPORT " + json.dumps(report, sort_keys=True))
    if report["problems"]:
        print("SMOKE FAILED: " + "; ".join(report["problems"]), file=sys.stderr)
        return 1
    print(f"SMOKE OK: {len(seen)} node(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
