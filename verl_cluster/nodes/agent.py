"""Talking to nodes: probe, stop our Ray, query the GCS — via the node-side script over any runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from verl_cluster.config.cluster import ClusterSpec, NodeSpec
from verl_cluster.errors import RunnerError
from verl_cluster.facts import nvml_node
from verl_cluster.launchers import runner_for
from verl_cluster.nodes import node_script, temp_dir_node
from verl_cluster.nodes.auth import ray_auth_env
from verl_cluster.runners import CommandRunner, HostResult, fan_out
from verl_cluster.runners.remote_python import run_python, script_source

SCRIPT = script_source(node_script.__file__, nvml_node.__file__, temp_dir_node.__file__)


@dataclass(frozen=True)
class Probe:
    """What a node told us about itself and our Ray on it."""

    hostname: str
    home: str
    python: str
    ray_version: str | None
    gpus: list[dict] = field(default_factory=list)
    nvml_error: str | None = None
    kinds: list[str] = field(default_factory=list)  # our Ray processes by kind
    raylet: bool = False
    gcs: bool = False
    state: dict | None = None  # what `up` saved when it started this node
    old_kinds: list[str] = field(default_factory=list)  # our Ray running under the earlier default temp dir
    temp_dir_problem: list[str] | None = None  # [what, fix]: the temp dir is not safe here (temp_dir_node.py)
    siblings: list[str] = field(default_factory=list)  # other clusters of ours whose Ray runs on this machine

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Probe":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


class Node:
    """One configured node with its runner."""

    def __init__(self, spec: ClusterSpec, role: str, node: NodeSpec, runner: CommandRunner | None = None):
        self.spec, self.role, self.node = spec, role, node
        self.host = node.host
        self.ip = spec.node_ip(node)
        self.runner = runner or runner_for(spec, node)
        self.python = spec.python_executable(node)

    def script(self, *args: str, timeout: float = 30.0, env: dict | None = None) -> Any:
        return run_python(self.runner, self.python, SCRIPT, args, env=env, timeout=timeout)

    def _dirs(self) -> tuple[str, ...]:
        old = self.spec.legacy_temp_dir
        return (self.spec.temp_dir, self.spec.gcs_address) + ((old,) if old else ())

    def probe(self) -> Probe:
        return Probe.from_json(self.script("probe", *self._dirs()))

    def kill(self) -> dict:
        """Stop this cluster's Ray here: under its temp dir, and under the earlier default one."""
        return self.script("kill", *self._dirs(), timeout=30)

    def start_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` (`ray start ...`) run through the node script: the temp dir made and judged first, on the node,
        and the daemons started from inside it (they keep that cwd; the caller's may be removed)."""
        return [self.python, "-c", SCRIPT, "start", self.spec.temp_dir, "--", *argv]

    def gcs(self, with_jobs: bool = False, token_path: str | None = None) -> dict:
        """Node table from the GCS, queried on this node (the head) so no port has to be open to us."""
        args = ["gcs", self.spec.gcs_address]
        if with_jobs:
            h = "127.0.0.1" if self.spec.security.dashboard_host == "loopback" else self.spec.head_ip
            args.append(f"http://{h}:{self.spec.head.dashboard_port}")
        env = ray_auth_env(self.spec, token_path) if token_path else ray_auth_env(self.spec)
        return self.script(*args, env=env, timeout=30)

    def wait_nodes(self, expect: dict[str, int], timeout_s: float, token_path: str | None = None) -> dict:
        """Node table once every expected node (ip -> min GPUs) is alive, or after timeout_s."""
        import json

        env = ray_auth_env(self.spec, token_path) if token_path else ray_auth_env(self.spec)
        return self.script("wait", self.spec.gcs_address, self.spec.head_ip, json.dumps(expect), str(timeout_s),
                           env=env, timeout=timeout_s + 30)

    def close(self) -> None:
        self.runner.close()


def temp_dir_findings(spec: ClusterSpec, probe: Probe) -> list[tuple[str, str]]:
    """(what, fix) about where a node's Ray keeps its files: a temp dir others can reach, or our Ray still running
    under the earlier default temp dir in the shared /tmp."""
    out = []
    if probe.temp_dir_problem:
        what, fix = probe.temp_dir_problem
        out.append((f"ray.temp_dir: {what}", fix))
    if probe.old_kinds:
        out.append((f"this cluster's Ray runs under the earlier default temp dir {spec.legacy_temp_dir}, which "
                    f"other local users can write into ({', '.join(probe.old_kinds[:4])})",
                    f"`verl-cluster up --restart {spec.source}` moves it to {spec.temp_dir} (running jobs end)"))
    return out


def cluster_nodes(spec: ClusterSpec) -> list[Node]:
    return [Node(spec, role, n) for role, n in spec.nodes()]


def run_on_nodes(spec: ClusterSpec, verb: str, args: Callable[[Node], tuple[str, ...]],
                 timeout: float) -> list[HostResult]:
    """The node script's `verb` on every node at once: one result per node, in order, keyed by its ip; a node
    that cannot be reached gives its RunnerError and never hides the others."""
    def one(node: Node) -> dict:
        try:
            return node.script(verb, *args(node), timeout=timeout)
        finally:
            node.close()

    nodes = cluster_nodes(spec)
    results = fan_out(nodes, one, key=lambda n: n.ip, max_workers=max(1, len(nodes)))
    for r in results:
        if r.error is not None and not isinstance(r.error, RunnerError):
            raise r.error  # a bug here, not an unreachable node
    return results


def index_by_ip(gcs_nodes: list[dict], head_ip: str) -> dict[str, dict]:
    """GCS node entries by address: a live registration wins over dead ones of earlier starts.
    Ray replaces a loopback --node-ip-address with the machine's address, so the head is also found
    by its head flag."""
    by_ip: dict[str, dict] = {}
    for x in gcs_nodes:
        cur = by_ip.get(x["ip"])
        if cur is None or (x["alive"] and not cur["alive"]) or (
                x["alive"] == cur["alive"] and x["start_time_ms"] > cur["start_time_ms"]):
            by_ip[x["ip"]] = x
    if head_ip not in by_ip:
        heads = [x for x in gcs_nodes if x.get("is_head") and x["alive"]]
        if heads:
            by_ip[head_ip] = heads[0]
    return by_ip
