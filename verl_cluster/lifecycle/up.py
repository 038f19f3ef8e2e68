"""`up`: start (or heal) the cluster. Head first, then all workers in parallel, then wait for registration.

Idempotent: nodes whose Ray is alive with the same config are left alone; a dead or missing node is
(re)started; a head restart rejoins every worker. A node that fails is reported with its reason and the
others stay up.
"""

from __future__ import annotations

import concurrent.futures as cf
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from verl_cluster.enums import StrEnum
from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import ray_versions
from verl_cluster.errors import ClusterError, ConfigError, ConnectError, RunnerError
from verl_cluster.launchers import launcher_for
from verl_cluster.nodes.auth import ensure_token, node_token_path, refuse_open_dashboard, remote_token_path
from verl_cluster.lifecycle.commands import NodeCommand, plan_start
from verl_cluster.nodes.agent import Node, Probe, cluster_nodes, index_by_ip
from verl_cluster.runners.remote_python import MARK
from verl_cluster.runners import fan_out

Progress = Callable[[str, str], None]  # (host, what is happening)


class NodeAction(StrEnum):
    """What `up` did with a node; the value is what --json prints."""

    PENDING = "pending"
    KEPT_PENDING = "kept-pending"  # running and kept, until its registration is confirmed
    KEPT = "kept"
    STARTED = "started"
    RESTARTED = "restarted"
    CHANGED = "changed"  # running with another config: left alone
    FAILED = "failed"
    UNREACHABLE = "unreachable"


OK_ACTIONS = (NodeAction.KEPT, NodeAction.STARTED, NodeAction.RESTARTED)
SETTLE_S = 60.0  # Ray's GCS fails a silent node after ~30 s of health checks by default


@dataclass
class NodeOutcome:
    host: str
    role: str
    ip: str
    action: NodeAction = NodeAction.PENDING
    reason: str = ""
    log_tail: str = ""
    seconds: float = 0.0
    gpus: Optional[float] = None
    cpus: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.action in OK_ACTIONS

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("host", "role", "ip", "action", "reason", "log_tail", "seconds", "gpus",
                                            "cpus")}
        return d | {"action": self.action.value, "ok": self.ok}  # the value keeps its place among the keys


@dataclass
class UpReport:
    cluster: str
    nodes: list[NodeOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return all(n.ok for n in self.nodes)

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "healthy": self.healthy, "seconds": round(self.seconds, 2),
                "nodes": [n.to_json() for n in self.nodes]}


def _expected_gpus(node: Node, probe: Probe) -> int:
    return node.node.gpus if node.node.gpus is not None else len(probe.gpus or [])


class _Up:
    def __init__(self, spec: ClusterSpec, restart: bool, node_env: dict | None, progress: Progress | None):
        self.spec, self.restart = spec, restart
        self.launcher = launcher_for(spec)
        self.node_env = node_env or {}
        self.say = progress or (lambda host, msg: None)
        self.nodes = cluster_nodes(spec)
        self.out = {n.host: NodeOutcome(n.host, n.role, n.ip) for n in self.nodes}
        self.probes: dict[str, Probe] = {}
        self.cmds: dict[str, NodeCommand] = {}
        refuse_open_dashboard(spec)
        self.token = ensure_token(spec)
        self.head_launching = threading.Event()

    # ---- steps ----
    def probe_all(self) -> None:
        for n in self.nodes:
            self.say(n.host, "connecting")
        for r in fan_out(self.nodes, lambda n: n.probe(), key=lambda n: n.host):
            if r.ok:
                self.probes[r.host] = r.value
                continue
            o = self.out[r.host]
            o.action = NodeAction.UNREACHABLE if isinstance(r.error, ConnectError) else NodeAction.FAILED
            o.reason = r.reason
            o.log_tail = getattr(r.error, "hint", "") or ""
            self.say(r.host, f"[red]{o.action}[/]: {o.reason}")
        self.refuse_incompatible()
        self.refuse_unsafe_temp_dir()
        tokens = {h: node_token_path(self.spec, p.home) for h, p in self.probes.items()}
        self.cmds = {c.host: c for c in plan_start(self.spec, self.node_env, tokens)}

    def refuse_incompatible(self) -> None:
        """A node whose Ray cannot join this cluster fails here, with the fix, rather than in `ray start`."""
        head = self.probes.get(self.nodes[0].host)
        for n in self.nodes:
            p = self.probes.get(n.host)
            if p is None:
                continue
            head_version = head.ray_version if head and n.role == "worker" else None
            why = ray_versions.start_refusal(p.ray_version, head_version, self.spec.security.auth == "token")
            if why:
                o = self.out[n.host]
                o.action, o.reason = NodeAction.FAILED, why
                del self.probes[n.host]  # nothing more is done on it
                self.say(n.host, f"[red]failed[/]: {why}")

    def refuse_unsafe_temp_dir(self) -> None:
        """Before anything starts: a temp dir that other local users can reach (judged on each node), or a cluster
        still running under the earlier default temp dir (it moves only with --restart)."""
        bad = [(h, p.temp_dir_problem) for h, p in self.probes.items() if p.temp_dir_problem]
        if bad:
            host, (what, fix) = bad[0]
            more = f" (and on {len(bad) - 1} more node(s))" if len(bad) > 1 else ""
            raise ConfigError(f"{self.spec.source}: {host}: ray.temp_dir {self.spec.temp_dir}: {what}{more}", fix)
        old = [h for h, p in self.probes.items() if p.old_kinds]
        if old and not self.restart:
            raise ClusterError(
                f"cluster {self.spec.cluster_name} runs under the earlier default temp dir "
                f"{self.spec.legacy_temp_dir} (on {', '.join(old)}), which other local users can write into",
                f"`verl-cluster up --restart {self.spec.source}` moves it to {self.spec.temp_dir} (running jobs end)")

    def _running(self, n: Node) -> bool:
        p = self.probes[n.host]
        return self.launcher.running(n.role, p.raylet, p.gcs)

    def _changed(self, n: Node) -> bool:
        state = self.probes[n.host].state or {}
        return bool(state) and state.get("fingerprint") != self.cmds[n.host].fingerprint

    def start(self, n: Node, restarting: bool) -> None:
        o, cmd, t0 = self.out[n.host], self.cmds[n.host], time.monotonic()
        if self.probes[n.host].kinds or self.probes[n.host].old_kinds:
            self.say(n.host, "stopping leftovers of this cluster")
            n.kill()
        if self.token:
            self.say(n.host, "copying auth token")
            n.runner.put_file(str(self.token), remote_token_path(self.spec), 0o600)
        self.say(n.host, "ray start")
        if n.role == "head":
            self.head_launching.set()  # old processes are gone: from now on an open GCS port is the new head
        res = self.launcher.start_ray(n.runner, n.start_argv(cmd.argv), env=cmd.env,
                                      timeout=self.spec.ray.start_timeout_s)
        o.seconds = time.monotonic() - t0
        refused = _refusal(res.stdout)
        if refused:  # the temp dir, judged again on the node as it was made: nothing was started
            o.action, o.reason, o.log_tail = NodeAction.FAILED, f"ray.temp_dir: {refused[0]}", f"fix: {refused[1]}"
            self.say(n.host, f"[red]refused[/]: {refused[0]}")
            return
        if not res.ok:
            o.action, o.reason = NodeAction.FAILED, f"ray start failed (exit {res.rc})"
            o.log_tail = res.tail(12)
            self.say(n.host, f"[red]ray start failed[/] (exit {res.rc})")
            n.kill()  # a half-started head leaves its GCS and dashboard behind
            return
        n.runner.put_text(_state_json(cmd), f"{self.spec.temp_dir}/vc-node.json", 0o600)
        o.action = NodeAction.RESTARTED if restarting else NodeAction.STARTED
        self.say(n.host, "started; waiting to register")

    def run_head(self) -> bool:
        head = self.nodes[0]
        if head.host not in self.probes:
            return False
        if self._running(head) and not self.restart:
            if self._changed(head):
                self._mark_changed(head)
            else:
                self.out[head.host].action = NodeAction.KEPT
                self.say(head.host, "running")
            return True
        try:
            self.start(head, restarting=bool(self.probes[head.host].kinds) or self.restart)
        except RunnerError as e:
            o = self.out[head.host]
            o.action, o.reason = NodeAction.FAILED, e.reason
        return self.out[head.host].ok

    def run_workers(self, head_restarted: bool) -> None:
        todo = []
        for n in self.nodes[1:]:
            if n.host not in self.probes:
                continue
            if self._running(n) and not (self.restart or head_restarted):
                if self._changed(n):
                    self._mark_changed(n)
                else:
                    self.out[n.host].action = NodeAction.KEPT_PENDING  # confirmed by registration below
                    self.say(n.host, "running")
                continue
            todo.append(n)
        restarting = {n.host: bool(self.probes[n.host].kinds) or self.restart for n in todo}
        for r in fan_out(todo, lambda n: self.start(n, restarting[n.host]), key=lambda n: n.host):
            if not r.ok:
                o = self.out[r.host]
                o.action, o.reason = NodeAction.FAILED, r.reason
                self.say(r.host, f"[red]failed[/]: {r.reason}")

    def _mark_changed(self, n: Node) -> None:
        o = self.out[n.host]
        o.action = NodeAction.CHANGED
        what = changed_settings(self.probes[n.host].state or {}, self.cmds[n.host])
        o.reason = (f"running with another config ({'; '.join(what) if what else 'a setting differs'}): "
                    "`verl-cluster up --restart` applies the new one (running jobs end)")
        self.say(n.host, f"[yellow]config changed[/]: {'; '.join(what) or 'a setting differs'}")

    def wait_registered(self) -> None:
        """Poll the GCS (on the head) until every node we expect is ALIVE with its GPUs."""
        head = self.nodes[0]
        waiting = {h for h, o in self.out.items() if o.action in (*OK_ACTIONS, NodeAction.KEPT_PENDING)}
        if not waiting or self.out[head.host].action not in (*OK_ACTIONS, NodeAction.CHANGED):
            for h in waiting:
                self.out[h].action, self.out[h].reason = NodeAction.FAILED, "head is not running"
            return
        token = node_token_path(self.spec, self.probes[head.host].home) if self.token else None
        ip_of = {n.ip: n for n in self.nodes}
        expect = {n.ip: _expected_gpus(n, self.probes[n.host]) for n in self.nodes if n.host in waiting}
        try:
            table = head.wait_nodes(expect, self.spec.ray.register_timeout_s, token_path=token)
            last = {ip: x for ip, x in index_by_ip(table["nodes"], self.spec.head_ip).items()
                    if x["alive"] and ip in ip_of}
            err = table.get("error") or ""
        except RunnerError as e:
            last, err = {}, e.reason
        for ip, n in ip_of.items():
            if n.host not in waiting:
                continue
            o, info = self.out[n.host], last.get(ip)
            want = _expected_gpus(n, self.probes[n.host])
            if o.action == NodeAction.KEPT_PENDING:
                o.action = NodeAction.KEPT
            if info is None:
                if o.action == NodeAction.KEPT:  # raylet process alive but not in the GCS: restart it next time
                    o.action = NodeAction.FAILED
                    o.reason = "Ray is running there but not registered with this head; run `up --restart`"
                else:
                    o.action = NodeAction.FAILED
                    o.reason = (f"did not register within {self.spec.ray.register_timeout_s:.0f}s"
                                + (f" ({err})" if err else "")
                                + f"; is GCS port {self.spec.head.gcs_port} on {self.spec.head_ip} reachable from it?")
                    o.log_tail = self._raylet_log(n)
                self.say(n.host, f"[red]{o.reason}[/]")
                continue
            o.gpus, o.cpus = info["resources"].get("GPU", 0.0), info["resources"].get("CPU", 0.0)
            if o.gpus < want:
                o.action = NodeAction.FAILED
                o.reason = f"registered with {o.gpus:g} GPUs, expected {want} (NVML sees {len(self.probes[n.host].gpus)})"
                self.say(n.host, f"[red]{o.reason}[/]")
            else:
                self.say(n.host, f"[green]{o.action}[/]")

    def settle(self, limit_s: float = SETTLE_S, poll_s: float = 1.0) -> None:
        """After a worker was started again under a head that kept running: wait (bounded) until the GCS no longer
        lists the node's old registration alive too. A host that died is marked dead only when the GCS health
        check fails it (tens of seconds); a job submitted before that may place work on the dead registration.
        Past the bound the node's outcome says so (the cluster is usable, a job may still land there once)."""
        head = self.nodes[0]
        if self.out[head.host].action != NodeAction.KEPT:
            return  # a new head has a new GCS: no old registrations
        ips = {o.ip for o in self.out.values() if o.action in (NodeAction.STARTED, NodeAction.RESTARTED)}
        if not ips:
            return
        token = node_token_path(self.spec, self.probes[head.host].home) if self.token else None
        deadline, said = time.monotonic() + limit_s, set()
        by_ip = {o.ip: o for o in self.out.values()}
        while True:
            try:
                table = head.gcs(token_path=token).get("nodes", [])
            except RunnerError:
                return  # advisory: every node was just seen registered
            twice = sorted(ip for ip in ips if sum(1 for x in table if x.get("alive") and x.get("ip") == ip) > 1)
            if not twice:
                return
            if time.monotonic() >= deadline:
                for ip in twice:
                    by_ip[ip].reason = (f"the GCS still lists its old registration alive after {limit_s:.0f}s "
                                        "(its health check has not failed it yet): a job submitted now may land there")
                return
            for ip in set(twice) - said:
                self.say(by_ip[ip].host, "waiting for the GCS to mark its old registration dead")
                said.add(ip)
            time.sleep(poll_s)

    def _raylet_log(self, n: Node) -> str:
        try:
            res = n.runner.run(["sh", "-c", 'tail -n 12 "$1"/session_latest/logs/raylet.out', "sh",
                                self.spec.temp_dir], timeout=10)
            return res.stdout.strip()
        except RunnerError:
            return ""

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def _refusal(stdout: str) -> list[str] | None:
    """[what, fix] when the node script refused the temp dir instead of starting Ray."""
    import json

    for line in stdout.splitlines():
        if line.startswith(MARK):
            try:
                found = json.loads(line[len(MARK):]).get("refused")
            except (ValueError, AttributeError):
                return None
            return [str(x) for x in found][:2] if isinstance(found, list) and len(found) == 2 else None
    return None


def _env_digest(env: dict[str, str]) -> dict[str, str]:
    """Per variable, a short hash of its value: enough to say which one changed, never the value (a secret)."""
    import hashlib

    return {k: hashlib.sha256(str(v).encode()).hexdigest()[:12] for k, v in sorted(env.items())
            if k != "RAY_AUTH_TOKEN_PATH"}  # where the token lives is not part of the config (as in the fingerprint)


def _state_json(cmd: NodeCommand) -> str:
    import json

    return json.dumps({"fingerprint": cmd.fingerprint, "role": cmd.role, "ip": cmd.ip,
                       "started_at": time.time(), "argv": list(cmd.argv), "env": _env_digest(cmd.env)})


# `ray start` flags -> the cluster.yaml setting that writes them (lifecycle/commands.py)
FLAG_SETTINGS = {
    "--port": "head.gcs_port", "--dashboard-port": "head.dashboard_port",
    "--ray-client-server-port": "head.ray_client_port", "--dashboard-host": "security.dashboard_host",
    "--address": "the head's address (head.host/node_ip, head.gcs_port)", "--node-ip-address": "node_ip",
    "--temp-dir": "ray.temp_dir", "--object-store-memory": "ray.object_store_memory", "--num-gpus": "gpus",
    "--num-cpus": "cpus", "--resources": "resources", "--labels": "labels",
    "--node-manager-port": "ray.ports.node_manager", "--object-manager-port": "ray.ports.object_manager",
    "--dashboard-agent-grpc-port": "ray.ports.dashboard_agent_grpc",
    "--dashboard-agent-listen-port": "ray.ports.dashboard_agent_listen",
    "--metrics-export-port": "ray.ports.metrics_export", "--runtime-env-agent-port": "ray.ports.runtime_env_agent",
    "--min-worker-port": "ray.ports.min_worker", "--max-worker-port": "ray.ports.max_worker",
}


def _flags(argv: list[str]) -> dict[str, str]:
    """`ray start` words as {--flag: value} (a flag without a value: "")."""
    out: dict[str, str] = {}
    words = [str(w) for w in argv[2:]]  # past `ray start`
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            flag, eq, value = w.partition("=")
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value, i = words[i + 1], i + 1
            out[flag] = value
        i += 1
    return out


def changed_settings(state: dict, cmd: NodeCommand) -> list[str]:
    """What differs between the Ray running on a node (its vc-node.json) and what the config would start now, as
    cluster.yaml settings: `ray.object_store_memory 209715200 -> 419430400`, `ray.env: FOO changed`. [] when the
    running node's record is too old to say."""
    old_argv = state.get("argv")
    if not isinstance(old_argv, list) or not old_argv:
        return []
    out: list[str] = []
    if str(old_argv[0]) != cmd.argv[0]:
        out.append(f"ray_executable {old_argv[0]} -> {cmd.argv[0]}")
    old, new = _flags(old_argv), _flags(list(cmd.argv))
    other: list[str] = []
    for flag in sorted(set(old) | set(new), key=lambda f: (f not in FLAG_SETTINGS, f)):
        a, b = old.get(flag), new.get(flag)
        if a == b:
            continue
        name = FLAG_SETTINGS.get(flag)
        if name is None:
            other.append(flag)
        elif a is None or b is None:
            out.append(f"{name} {'set' if a is None else 'unset'}" + (f" ({b})" if b else ""))
        else:
            out.append(f"{name} {a} -> {b}")
    if other:
        out.append(f"ray.start_args: {', '.join(other)}")
    old_env = state.get("env")
    if isinstance(old_env, dict):
        new_env = _env_digest(cmd.env)
        for k in sorted(set(old_env) | set(new_env)):
            if old_env.get(k) != new_env.get(k):
                how = "added" if k not in old_env else "removed" if k not in new_env else "changed"
                out.append(f"env {k} {how} (ray.env, the node's env or the network settings)")
    elif not out:
        out.append("the Ray environment (ray.env, the node's env or the network settings)")
    return out


def _port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def up(spec: ClusterSpec, *, restart: bool = False, node_env: dict[str, dict[str, str]] | None = None,
       progress: Progress | None = None) -> UpReport:
    """Bring the cluster to its configured state; never raises for a single node's failure."""
    t0 = time.monotonic()
    job = _Up(spec, restart, node_env, progress)
    try:
        job.probe_all()
        head = job.nodes[0]
        head_starts = head.host in job.probes and (restart or not job._running(head))
        with cf.ThreadPoolExecutor(max_workers=1) as pool:
            head_done = pool.submit(job.run_head)
            if head_starts:
                # `ray start --head` returns seconds after its GCS listens, and a worker's `ray start` retries
                # the GCS by itself: start the workers as soon as the port answers (or when the head is done,
                # if this machine cannot reach that port)
                while not head_done.done() and not (job.head_launching.is_set()
                                                    and _port_open(spec.head_ip, spec.head.gcs_port)):
                    time.sleep(0.1)
            head_ok = head_done.result() if head_done.done() else True
            if head_ok:
                job.run_workers(head_starts)
            head_ok = head_done.result()
        if not head_ok:
            for n in job.nodes[1:]:
                o = job.out[n.host]
                if o.action in (NodeAction.PENDING, NodeAction.STARTED, NodeAction.RESTARTED, NodeAction.KEPT_PENDING):
                    o.action, o.reason = NodeAction.FAILED, "the head did not come up"
        job.wait_registered()
        job.settle()
    finally:
        job.close()
    return UpReport(spec.cluster_name, [job.out[n.host] for n in job.nodes], time.monotonic() - t0)
