"""`launcher: slurm`: the cluster's nodes come from the allocation (head = its first node), filled into the
cluster config before it is validated, so every command sees an ordinary ClusterSpec."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Optional

from verl_cluster.errors import ConfigError
from verl_cluster.slurm.allocation import Allocation, check_tools, job_id_from, read_allocation

CLUSTER_DIR = "~/.verl-cluster/slurm"


def safe_name(job_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", str(job_id))


def fill(data: dict, source: str, read: Callable[..., Allocation] = read_allocation) -> dict:
    """The cluster config with head/workers (and the job id) from the allocation."""
    if data.get("workers"):
        raise ConfigError(f"{source}: `workers` come from the Slurm allocation when launcher is slurm",
                          "remove `workers:` (and head.host); the allocation's first node is the head")
    head = dict(data.get("head") or {})
    if head.get("host") or head.get("node_ip"):
        raise ConfigError(f"{source}: head.host comes from the Slurm allocation when launcher is slurm",
                          "remove head.host/node_ip (head.gcs_port and the other head settings may stay)")
    slurm = dict(data.get("slurm") or {})
    alloc = read(job_id=slurm.get("job_id"))
    slurm["job_id"] = alloc.job_id
    out = {**data, "slurm": slurm}
    name = str(out.get("cluster_name") or "slurm-{job_id}")
    out["cluster_name"] = name.replace("{job_id}", safe_name(alloc.job_id))
    security = dict(out.get("security") or {})
    if security.get("dashboard_host") == "loopback":
        raise ConfigError(f"{source}: security.dashboard_host loopback needs an SSH tunnel, which Slurm mode has none of",
                          "use `private` (the default here): the Jobs API listens on the head's address, token auth on")
    security.setdefault("dashboard_host", "private")
    out["security"] = security
    nodes = [{"host": n.name, "node_ip": n.addr, **({"gpus": n.gpus} if n.gpus is not None else {}),
              **({"cpus": n.cpus} if n.cpus is not None else {})} for n in alloc.nodes]
    out["head"] = {**head, **nodes[0]}
    out["workers"] = nodes[1:]
    return out


def cluster_file(env: Optional[dict] = None) -> str:
    """A cluster file for `--slurm` with no file: launcher slurm, named after the job. Commands and job records
    need a file; this one holds only what is the same for every command inside this allocation."""
    check_tools()
    jid = job_id_from(os.environ if env is None else env)
    path = Path(os.path.expanduser(CLUSTER_DIR)) / f"cluster-{safe_name(jid)}.yaml"
    text = (f"# written by `verl-cluster up --slurm` inside Slurm job {jid}\ncluster_name: slurm-{safe_name(jid)}\n"
            f"launcher: slurm\nslurm:\n  job_id: \"{jid}\"  # so jobs/logs/stop -c THIS_FILE work from other shells\n")
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)
