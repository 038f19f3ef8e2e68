"""The port matrix: can every node open every port Ray needs on every other node?

Each node runs netprobe.py `serve`: it binds every needed port that is free (short-lived listeners before
`up`) and reports the ones already bound (with the cluster up, Ray holds them: those are probed live).
Then every node TCP-connects to every other node's ports in parallel, each connect with a timeout.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import listeners_node, netprobe
from verl_cluster.errors import RunnerError
from verl_cluster.runners import CommandRunner, fan_out
from verl_cluster.runners.remote_python import MARK, run_python, script_source

NETPROBE_SOURCE = script_source(netprobe.__file__)
LISTENERS_SOURCE = script_source(listeners_node.__file__)


@dataclass(frozen=True)
class PortNeed:
    port: int
    name: str
    head_only: bool = False


def needed_ports(spec: ClusterSpec) -> list[PortNeed]:
    """Ports other nodes connect to: GCS/client (/dashboard) on the head; raylet, object manager, agents and a
    sample of the worker range on every node."""
    p = spec.ray.ports
    out = [PortNeed(spec.head.gcs_port, "gcs", True), PortNeed(spec.head.ray_client_port, "ray_client", True)]
    if spec.security.dashboard_host != "loopback":
        out.append(PortNeed(spec.head.dashboard_port, "dashboard", True))
    out += [PortNeed(p.node_manager, "node_manager"), PortNeed(p.object_manager, "object_manager"),
            PortNeed(p.dashboard_agent_grpc, "dashboard_agent_grpc"),
            PortNeed(p.dashboard_agent_listen, "dashboard_agent_listen")]
    mid = (p.min_worker + p.max_worker) // 2
    for port in sorted({p.min_worker, mid, p.max_worker - 2}):  # max_worker itself is kept for the perf server
        if p.min_worker <= port <= p.max_worker:
            out.append(PortNeed(port, "worker"))
    return out


def perf_candidates(spec: ClusterSpec) -> list[int]:
    """Where the perf server may listen: top of the worker range, which must be open between nodes anyway."""
    p = spec.ray.ports
    return [port for port in range(p.max_worker, max(p.min_worker, p.max_worker - 40) - 1, -1)]


@dataclass(frozen=True)
class NodeServer:
    host: str
    bound: list[int]
    in_use: list[int]
    perf_port: int | None


class ServeSession:
    """netprobe `serve` on every node, stopped on exit. Nodes whose server failed are in `errors`."""

    def __init__(self, spec: ClusterSpec, runners: Mapping[str, CommandRunner], hosts: Sequence[str],
                 ready_timeout: float = 20.0, lifetime_s: float = 300.0):
        self.spec, self.runners = spec, runners
        self.servers: dict[str, NodeServer] = {}
        self.errors: dict[str, str] = {}
        self._procs = []
        nodes = {n.host: n for _, n in spec.nodes()}
        ports = sorted({n.port for n in needed_ports(spec)})
        args = ["serve", ",".join(map(str, ports)), ",".join(map(str, perf_candidates(spec))), str(lifetime_s)]

        def start(host: str) -> NodeServer:
            runner = runners[host]
            proc = runner.popen([spec.python_executable(nodes[host]), "-c", NETPROBE_SOURCE, *args])
            self._procs.append(proc)
            data = _first_json(proc, ready_timeout, host)
            return NodeServer(host, data["bound"], data["in_use"], data["perf_port"])

        for r in fan_out(list(hosts), start):
            if r.ok:
                self.servers[r.host] = r.value
            else:
                self.errors[r.host] = r.reason

    def close(self) -> None:
        fan_out(self._procs, lambda p: p.terminate(), key=lambda p: str(id(p)))
        self._procs = []

    def __enter__(self) -> "ServeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_json(proc, timeout: float, host: str) -> dict:
    """Read the process's output until its JSON line, or fail after `timeout` seconds."""
    import json

    q: queue.Queue = queue.Queue()
    tail: list[str] = []

    def pump() -> None:
        try:
            for line in proc.lines():
                if line.startswith(MARK):
                    q.put(json.loads(line[len(MARK):]))
                    return
                tail.append(line)
        except Exception as e:  # noqa: BLE001 - reported through the queue
            q.put(e)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        item = q.get(timeout=timeout)
    except queue.Empty:
        raise RunnerError(host, f"port listener did not start within {timeout:.0f}s")
    if isinstance(item, dict):
        return item
    raise RunnerError(host, f"port listener failed: {(' '.join(tail[-3:]) or item or 'no output')}")


@dataclass(frozen=True)
class PortResult:
    src: str
    dst: str
    port: int
    name: str
    state: str  # open | refused | timeout | error: ...
    connect_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.state == "open"


@dataclass(frozen=True)
class PortMatrix:
    results: list[PortResult] = field(default_factory=list)
    in_use: dict[str, list[int]] = field(default_factory=dict)  # ports already bound before we probed
    live: bool = False  # the head's GCS port was already bound: the cluster (or something) is up
    errors: dict[str, str] = field(default_factory=dict)  # node -> why it could not take part

    def blocked(self) -> list[PortResult]:
        return [r for r in self.results if not r.ok]

    def to_json(self) -> dict:
        return {"live": self.live, "in_use": self.in_use, "errors": self.errors,
                "checked": len(self.results),
                "blocked": [{"src": r.src, "dst": r.dst, "port": r.port, "name": r.name, "state": r.state}
                            for r in self.blocked()]}


def probe_matrix(spec: ClusterSpec, runners: Mapping[str, CommandRunner], session: ServeSession,
                 connect_timeout: float = 2.0) -> PortMatrix:
    nodes = {n.host: n for _, n in spec.nodes()}
    hosts = [h for h in nodes if h in session.servers]
    needs = needed_ports(spec)
    head = spec.head.host
    plan: dict[str, list[tuple[str, PortNeed]]] = {}
    for src in hosts:
        plan[src] = [(dst, need) for dst in hosts if dst != src for need in needs
                     if not need.head_only or dst == head]

    def run(src: str) -> dict:
        targets = [f"{spec.node_ip(nodes[dst])}:{need.port}" for dst, need in plan[src]]
        if not targets:
            return {}
        return run_python(runners[src], spec.python_executable(nodes[src]), NETPROBE_SOURCE,
                          ["probe", ",".join(targets), str(connect_timeout)],
                          timeout=connect_timeout * 2 + 30)

    results: list[PortResult] = []
    errors = dict(session.errors)
    for r in fan_out(hosts, run):
        if not r.ok:
            errors[r.host] = r.reason
            continue
        for dst, need in plan[r.host]:
            got = r.value.get(f"{spec.node_ip(nodes[dst])}:{need.port}", {"state": "no answer"})
            results.append(PortResult(r.host, dst, need.port, need.name, got["state"], got.get("ms")))
    in_use = {h: s.in_use for h, s in session.servers.items() if s.in_use}
    live = spec.head.gcs_port in in_use.get(head, [])
    return PortMatrix(results, in_use, live, errors)


def port_problems(spec: ClusterSpec, matrix: PortMatrix) -> list[tuple[str, str, str]]:
    """(node, what, fix) for blocked pairs, grouped per destination port; and ports taken before `up`."""
    nodes = {n.host: n for _, n in spec.nodes()}
    p = spec.ray.ports
    grouped: dict[tuple[str, int], list[PortResult]] = {}
    for r in matrix.blocked():
        grouped.setdefault((r.dst, r.port), []).append(r)
    out = []
    for (dst, port), rs in sorted(grouped.items()):
        srcs = sorted({r.src for r in rs})
        states = sorted({r.state for r in rs})
        name = rs[0].name
        span = f"{p.min_worker}-{p.max_worker}" if name == "worker" else str(port)
        dst_ip = spec.node_ip(nodes[dst])
        out.append((f"{', '.join(srcs)} -> {dst}",
                    f"TCP {port} ({name}) on {dst} ({dst_ip}) not reachable from {', '.join(srcs)}: "
                    f"{'/'.join(states)}",
                    f"open TCP {span} from {', '.join(srcs)} to {dst}"))
    if not matrix.live:
        names = {n.port: n.name for n in needed_ports(spec)}
        for host, ports in sorted(matrix.in_use.items()):
            for port in ports:
                if port in names:
                    out.append((host, f"TCP {port} ({names[port]}) is already in use on {host}: `ray start` "
                                f"will fail to bind it", f"stop what holds it (ss -ltnp 'sport = :{port}') or change "
                                f"ray.ports / head ports in the config"))
    return out


# ---- every port our Ray listens on ----

def pinned_ports(spec: ClusterSpec) -> dict[int, str]:
    """port -> config key name, for every port the config pins (the worker range aside)."""
    p, h = spec.ray.ports, spec.head
    return {h.gcs_port: "gcs", h.ray_client_port: "ray_client", h.dashboard_port: "dashboard",
            p.node_manager: "node_manager", p.object_manager: "object_manager",
            p.dashboard_agent_grpc: "dashboard_agent_grpc", p.dashboard_agent_listen: "dashboard_agent_listen",
            p.metrics_export: "metrics_export", p.runtime_env_agent: "runtime_env_agent",
            p.dashboard_metrics: "dashboard_metrics", p.autoscaler_metrics: "autoscaler_metrics"}


def port_name(spec: ClusterSpec, port: int) -> str | None:
    p = spec.ray.ports
    return pinned_ports(spec).get(port) or ("worker" if p.min_worker <= port <= p.max_worker else None)


def ray_listeners(spec: ClusterSpec, runners: Mapping[str, CommandRunner],
                  hosts: Sequence[str]) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Per node: every TCP port our Ray listens on, its bind address, its config key (None: not pinned) and how
    it answers a client without the token. Asked on the node itself, so loopback listeners are seen too."""
    from verl_cluster.nodes.agent import SCRIPT

    nodes = {n.host: n for _, n in spec.nodes()}

    def one(host: str) -> list[dict]:
        py = spec.python_executable(nodes[host])
        probe = run_python(runners[host], py, SCRIPT, ["probe", spec.temp_dir, spec.gcs_address], timeout=30)
        pids = ",".join(str(p) for p in probe.get("pids") or [])
        if not pids:
            return []
        got = run_python(runners[host], py, LISTENERS_SOURCE, [pids, str(spec.head.dashboard_port)], timeout=60)
        return [{**r, "name": port_name(spec, r["port"]) or _client_session(r)} for r in got["listeners"]]

    found, errors = {}, {}
    for r in fan_out(list(hosts), one):
        if r.ok:
            found[r.host] = r.value
        else:
            errors[r.host] = r.reason
    return found, errors


_LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def _client_session(r: dict) -> str | None:
    """A Ray Client session's own server: Ray puts it on 23000-23999 (fixed in proxier.py, no setting) and binds it
    to loopback only, so no firewall rule concerns it."""
    if "ray.util.client" in r["process"] and 23000 <= r["port"] < 24000 and r["address"] in _LOOPBACK:
        return "ray_client_session"
    return None
_METRICS = ("metrics_export", "dashboard_metrics", "autoscaler_metrics")  # Prometheus text: read-only, no token


def listener_problems(spec: ClusterSpec, listeners: Mapping[str, list[dict]]) -> list[tuple[str, str, str]]:
    """(node, what, fix): a port no config key pins, and (with token auth) one that serves without the token."""
    out = []
    for host, rows in sorted(listeners.items()):
        for r in rows:
            where = f"TCP {r['port']} ({r['process']}) on {r['address']}"
            if r["name"] is None:
                out.append((host, f"{where} is not pinned by the config: a firewall cannot be written for it",
                            "report it: verl-cluster pins every port Ray opens"))
            elif (spec.security.auth == "token" and r.get("open_without_token") and r["name"] not in _METRICS
                  and r["address"] not in _LOOPBACK):
                out.append((host, f"{where} ({r['name']}) answers without the token: {r['answer']}",
                            "firewall it from everything but the cluster's nodes"))
    return out
