"""`status`: every configured node alive/dead/missing, with resources, versions and running jobs; a Ray not started
by verl-cluster (a plain `ray start`) at the cluster's GCS address is named so, with what its GCS and Jobs API say."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verl_cluster.enums import StrEnum
from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import ray_versions
from verl_cluster.errors import ConnectError, KeyFileError, RunnerError
from verl_cluster.launchers import Launcher, launcher_for
from verl_cluster.nodes.auth import node_token_path, open_cluster_warnings
from verl_cluster.nodes.agent import Probe, cluster_nodes, index_by_ip, temp_dir_findings
from verl_cluster.runners import fan_out


class NodeState(StrEnum):
    """A configured node as `status` finds it; the value is what --json prints."""

    ALIVE = "alive"
    DEAD = "dead"  # our Ray was there and is not (or not whole, or not registered)
    MISSING = "missing"  # no Ray of this cluster there
    UNREACHABLE = "unreachable"  # we cannot log in
    SSH_KEY = "ssh-key"  # the SSH key file the config names is missing or unreadable: the node was never dialled
    OTHER_RAY = "other-ray"  # alive in a Ray not started by verl-cluster (a plain `ray start`)


@dataclass
class NodeStatus:
    host: str
    role: str
    ip: str
    state: NodeState
    reason: str = ""
    cpus: float = 0.0
    gpus: float = 0.0
    gpu_models: list[str] = field(default_factory=list)
    gpu_memory_mib: list[int] = field(default_factory=list)
    ray_version: Optional[str] = None
    python_version: Optional[str] = None
    resources: dict = field(default_factory=dict)
    available: Optional[dict] = None  # free resources (GPU, CPU, ...) when the GCS reports them
    node_id: str = ""
    other_clusters: list[str] = field(default_factory=list)  # other clusters of ours whose Ray runs on that machine

    @property
    def alive(self) -> bool:
        return self.state == NodeState.ALIVE

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["state"] = str(self.state)
        d["alive"] = self.alive
        d["gpus"] = int(self.gpus) if float(self.gpus).is_integer() else self.gpus
        return d


@dataclass
class ClusterStatus:
    cluster: str
    head_address: str
    dashboard: str  # as seen from the head
    dashboard_on_head_only: bool = False  # on a remote head's loopback: reach it with `verl-cluster dashboard`
    nodes: list[NodeStatus] = field(default_factory=list)
    jobs: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    extra_nodes: list[dict] = field(default_factory=list)  # alive in the GCS but not in the config
    client_ray_version: Optional[str] = None  # this machine's Ray, whose Jobs SDK talks to the head
    other_ray: bool = False  # the GCS address is held by a Ray not started by verl-cluster

    @property
    def healthy(self) -> bool:
        return bool(self.nodes) and all(n.alive for n in self.nodes)

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "healthy": self.healthy, "head": self.head_address,
                "dashboard": self.dashboard, "dashboard_on_head_only": self.dashboard_on_head_only,
                "nodes": [n.to_json() for n in self.nodes], "jobs": self.jobs,
                "problems": self.problems, "extra_nodes": self.extra_nodes,
                "client_ray_version": self.client_ray_version, "other_ray": self.other_ray}


def cluster_status(spec: ClusterSpec, with_jobs: bool = True) -> ClusterStatus:
    launcher = launcher_for(spec)
    nodes = cluster_nodes(spec)
    dash_host = "127.0.0.1" if spec.security.dashboard_host == "loopback" else spec.head_ip
    st = ClusterStatus(spec.cluster_name, spec.gcs_address, f"http://{dash_host}:{spec.head.dashboard_port}",
                       dashboard_on_head_only=dash_host == "127.0.0.1" and not spec.head.is_local,
                       client_ray_version=ray_versions.local_ray_version())
    try:
        probes = {r.host: r for r in fan_out(nodes, lambda n: n.probe(), key=lambda n: n.host)}
        head = nodes[0]
        table: dict | None = None
        hp = probes[head.host]
        if hp.ok and hp.value.gcs:
            token = node_token_path(spec, hp.value.home) if spec.security.auth == "token" else None
            try:
                table = head.gcs(with_jobs=with_jobs, token_path=token)
            except RunnerError as e:
                st.problems.append(f"GCS on the head did not answer: {e.reason}")
            if table and table.get("error"):
                st.problems.append(f"GCS on the head did not answer: {table['error']}")
                table = None
        elif hp.ok and not hp.value.raylet:  # no GCS nor raylet of ours on the head: a Ray we did not start?
            table = _other_ray(spec, head, with_jobs, st.problems)
            st.other_ray = table is not None
        by_ip = index_by_ip((table or {}).get("nodes", []), spec.head_ip)
        for n in nodes:
            st.nodes.append(_node_status(n, probes[n.host], by_ip.get(n.ip), table is not None, launcher,
                                         st.other_ray))
        if table:
            st.jobs = [j for j in table.get("jobs", []) if j["status"] in ("PENDING", "RUNNING")]
            if table.get("jobs_error"):
                st.problems.append(f"jobs: {table['jobs_error']}")
            known = {by_ip[n.ip]["node_id"] for n in nodes if n.ip in by_ip}
            st.extra_nodes = [x for x in table["nodes"] if x["alive"] and x["node_id"] not in known]
        st.problems += open_cluster_warnings(spec)
        st.problems += [f"{h}: {r.reason}; fix: {r.error.hint}" for h, r in probes.items()
                        if isinstance(r.error, KeyFileError) and r.error.hint]  # with the fix, as check says it
        st.problems += [f"{n.host}: {what}; fix: {fix}" for n in nodes if probes[n.host].ok
                        for what, fix in temp_dir_findings(spec, probes[n.host].value)]
        st.problems += _ray_version_problems(spec, st)
        st.problems += [f"{node}: {what}; fix: {fix}" for node, what, fix in launcher.node_problems()]
        versions = {(n.ray_version, n.python_version) for n in st.nodes
                    if n.state not in (NodeState.UNREACHABLE, NodeState.SSH_KEY)}
        if len({v[1] for v in versions}) > 1:
            st.problems.append("Python versions differ across nodes: "
                               + ", ".join(f"{n.host}={n.python_version}" for n in st.nodes if n.python_version))
    finally:
        for n in nodes:
            n.close()
    return st


def _other_ray(spec: ClusterSpec, head, with_jobs: bool, problems: list[str]) -> dict | None:
    """The node table (and jobs) of a Ray not started by verl-cluster that holds the cluster's GCS address, read
    on the head; None when nothing answers there. Asked without our token: it must not go to a Ray we did not
    start (on a shared head, another user's). One that wants a token is named as such."""
    args = ["gcs", spec.gcs_address]
    if with_jobs:
        h = "127.0.0.1" if spec.security.dashboard_host == "loopback" else spec.head_ip
        args.append(f"http://{h}:{spec.head.dashboard_port}")
    # GcsClient's own wait for a port that takes the connection but is no GCS is ~40 s: cut to a few
    env = {"RAY_AUTH_MODE": "disabled", "RAY_py_gcs_connect_timeout_s": "5"}
    try:
        table = head.script(*args, env=env, timeout=45)
    except RunnerError as e:
        problems.append(f"reading the GCS address {spec.gcs_address} on the head failed: {e.reason}")
        return None
    if not isinstance(table, dict) or table.get("refused"):
        return None
    if table.get("error"):
        problems.append(f"something holds the GCS address {spec.gcs_address} but is not a Ray that verl-cluster "
                        f"started, and it did not answer without a token: {table['error']}")
        return None
    return table


def _ray_version_problems(spec: ClusterSpec, st: ClusterStatus) -> list[str]:
    """Nodes' Ray against each other, the supported range and this machine's Ray, worded as check words them."""
    versions = {n.host: n.ray_version for n in st.nodes if n.ray_version}
    found = ray_versions.drift(versions) + ray_versions.ray_verdicts(
        versions, spec.head.host, st.client_ray_version, spec.security.auth == "token")
    return [(f"{p.what}" if p.node == "cluster" else f"{p.node}: {p.what}") + f"; fix: {p.fix}" for p in found]


def _login_failed(probe_result) -> tuple[NodeState, str]:
    """A node whose probe failed: a key file to fix, a host we cannot log into, or one with no Ray to probe."""
    e = probe_result.error
    if isinstance(e, KeyFileError):
        return NodeState.SSH_KEY, probe_result.reason
    return (NodeState.UNREACHABLE if isinstance(e, ConnectError) else NodeState.MISSING), probe_result.reason


OTHER_REASON = "a Ray not started by verl-cluster (a plain `ray start`?)"


def _node_status(n, probe_result, info: dict | None, gcs_ok: bool, launcher: Launcher,
                 other_ray: bool = False) -> NodeStatus:
    s = NodeStatus(n.host, n.role, n.ip, NodeState.MISSING)
    if other_ray:  # what the other Ray's GCS says, and what the node's own probe read (its Ray, Python, GPUs)
        p = probe_result.value if probe_result.ok else None
        if p is not None:
            s.ray_version, s.python_version = p.ray_version, p.python
            s.gpu_models = [g["name"] for g in p.gpus or []]
            s.gpu_memory_mib = [g["memory_total_mib"] for g in p.gpus or []]
        if info and info["alive"]:
            s.state, s.reason = NodeState.OTHER_RAY, OTHER_REASON
        elif p is None:
            s.state, s.reason = _login_failed(probe_result)
        else:
            s.reason = "not in the GCS of the Ray that runs on the head (not started by verl-cluster)"
        if info:
            s.node_id, s.resources, s.available = info["node_id"], info["resources"], info.get("available")
            s.cpus, s.gpus = info["resources"].get("CPU", 0.0), info["resources"].get("GPU", 0.0)
        return s
    if not probe_result.ok:
        # a host we cannot log into is unreachable; one that cannot run the node's Python has no Ray
        s.state, s.reason = _login_failed(probe_result)
        if info and info["alive"]:
            s.state = NodeState.ALIVE  # the GCS sees it even if we cannot log in
            s.reason = f"alive in Ray, but not reachable for us: {probe_result.reason}"
    else:
        p: Probe = probe_result.value
        s.ray_version, s.python_version = p.ray_version, p.python
        s.other_clusters = list(p.siblings or [])
        s.gpu_models = [g["name"] for g in p.gpus or []]
        s.gpu_memory_mib = [g["memory_total_mib"] for g in p.gpus or []]
        if not p.raylet:
            s.state = NodeState.DEAD if (info or p.kinds or p.state) else NodeState.MISSING
            s.reason = "raylet is not running" if s.state == NodeState.DEAD else "Ray is not running there"
        elif not launcher.running(n.role, p.raylet, p.gcs):  # the raylet runs: the head's GCS does not
            s.state, s.reason = NodeState.DEAD, "gcs_server is not running"
        elif gcs_ok and not (info and info["alive"]):
            s.state, s.reason = NodeState.DEAD, "raylet runs but is not registered with the head"
        elif not gcs_ok:
            s.state, s.reason = NodeState.DEAD, "the head's GCS is not answering"
        else:
            s.state = NodeState.ALIVE
    if info:
        s.node_id = info["node_id"]
        s.resources = info["resources"]
        s.available = info.get("available")
        s.cpus, s.gpus = info["resources"].get("CPU", 0.0), info["resources"].get("GPU", 0.0)
        if s.state == NodeState.ALIVE and not info["alive"]:
            s.state, s.reason = NodeState.DEAD, "the GCS marked it dead"
    return s
