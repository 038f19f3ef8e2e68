"""cluster.yaml schema: frozen dataclasses, parsed once by `load_cluster`."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from omegaconf import MISSING

from verl_cluster.config.loader import load
from verl_cluster.errors import ConfigError

LOCAL_HOSTS = ("localhost", "local", "127.0.0.1")
# what a field holds, checked at load (verl_cluster/config/names.py)
USER, PATH, EXE, ENV = {"kind": "user"}, {"kind": "path"}, {"kind": "executable"}, {"keys": "env_name"}
DEFAULT_TEMP_DIR = "/tmp/vc-{uid}/{cluster_name}"
LEGACY_TEMP_DIR = "/tmp/vc-{cluster_name}"  # the earlier default, in the shared /tmp: status/down still find it
MAX_TEMP_DIR = 60  # Ray's unix socket paths (temp dir + session + sockets/...) must stay under 107 chars


@dataclass(frozen=True)
class SshSpec:
    user: Optional[str] = field(default=None, metadata=USER)  # default: ~/.ssh/config, then the current user
    port: int = 22
    key_file: Optional[str] = field(default=None, metadata=PATH)  # default: ~/.ssh/config IdentityFile, agent, ~/.ssh/id_*
    known_hosts_file: str = field(default="~/.ssh/known_hosts", metadata=PATH)
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 120.0
    keepalive_s: int = 15
    accept_new_host_keys: bool = False
    use_ssh_config: bool = True


@dataclass(frozen=True)
class NodeSpec:
    host: str = field(default=MISSING, metadata={"kind": "host"})
    node_ip: Optional[str] = field(default=None, metadata={"kind": "ip"})  # address Ray advertises; default: host
    ssh_user: Optional[str] = field(default=None, metadata=USER)
    ssh_port: Optional[int] = None
    ssh_key_file: Optional[str] = field(default=None, metadata=PATH)
    gpus: Optional[int] = None  # default: NVML count on that node
    cpus: Optional[int] = None
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    ray_executable: Optional[str] = field(default=None, metadata=EXE)  # per-node override of ray.ray_executable
    env: dict[str, str] = field(default_factory=dict, metadata=ENV)

    @property
    def is_local(self) -> bool:
        return self.host in LOCAL_HOSTS


@dataclass(frozen=True)
class HeadSpec(NodeSpec):
    gcs_port: int = 6379
    dashboard_port: int = 8265
    ray_client_port: int = 10001


@dataclass(frozen=True)
class PortsSpec:
    """Ports Ray would otherwise pick at random; pinned so they can be firewalled and checked."""

    node_manager: int = 6700
    object_manager: int = 6701
    dashboard_agent_grpc: int = 6702
    dashboard_agent_listen: int = 52365
    metrics_export: int = 6703
    runtime_env_agent: int = 6704
    # the head's Prometheus endpoints of the dashboard and the autoscaler monitor (Ray's DASHBOARD_METRIC_PORT and
    # AUTOSCALER_METRIC_PORT; Ray binds them to all interfaces unless the head's address is loopback)
    dashboard_metrics: int = 6705
    autoscaler_metrics: int = 6706
    min_worker: int = 10002
    max_worker: int = 19999


@dataclass(frozen=True)
class RaySpec:
    # absolute path on the nodes; default: the `ray` beside this Python
    ray_executable: Optional[str] = field(default=None, metadata=EXE)
    # short: Ray's unix sockets must stay under 107 chars. {uid}: this user's id; the folder holding the temp dir
    # must be this user's alone (0700): Ray makes the temp dir writable by everyone (docs/security.md)
    temp_dir: str = field(default=DEFAULT_TEMP_DIR, metadata=PATH)
    object_store_memory: Optional[int] = None
    start_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict, metadata=ENV)
    ports: PortsSpec = field(default_factory=PortsSpec)
    start_timeout_s: float = 90.0
    register_timeout_s: float = 60.0


@dataclass(frozen=True)
class NetworkSpec:
    backend: str = field(default="auto", metadata={"choices": ("auto", "ucx", "tcp")})
    interface: str = field(default="auto", metadata=PATH)  # auto or an interface name, e.g. eth1


@dataclass(frozen=True)
class SecuritySpec:
    auth: str = field(default="token", metadata={"choices": ("token", "none")})
    dashboard_host: str = field(default="loopback", metadata={"choices": ("loopback", "private", "all")})
    token_file: str = field(default="~/.verl-cluster/{cluster_name}/auth_token", metadata=PATH)
    # dashboard_host: all with auth: none lets anyone who reaches the dashboard port run code on every node; `up`
    # refuses that unless this says it is meant (a lab network that is yours alone)
    allow_open_dashboard: bool = False


@dataclass(frozen=True)
class SlurmSpec:
    """launcher: slurm — nodes come from the allocation, commands reach them through srun."""

    job_id: Optional[str] = None  # default: SLURM_JOB_ID of this shell
    srun: str = field(default="srun", metadata=EXE)
    srun_args: list[str] = field(default_factory=list)  # added to every srun, e.g. [--mpi=none]
    log_dir: str = field(default="~/.verl-cluster/slurm", metadata=PATH)  # the Ray steps' output, one file per node


@dataclass(frozen=True)
class ClusterSpec:
    cluster_name: str = MISSING
    head: HeadSpec = MISSING
    workers: list[NodeSpec] = field(default_factory=list)
    launcher: str = field(default="ssh", metadata={"choices": ("ssh", "slurm")})
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    ssh: SshSpec = field(default_factory=SshSpec)
    ray: RaySpec = field(default_factory=RaySpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    security: SecuritySpec = field(default_factory=SecuritySpec)
    source: str = "<memory>"  # the file it came from (set by load_cluster)

    # ---- derived values: one place that knows the defaults ----
    def nodes(self) -> list[tuple[str, NodeSpec]]:
        """(role, spec) for the head then every worker."""
        return [("head", self.head)] + [("worker", w) for w in self.workers]

    def node_ip(self, node: NodeSpec) -> str:
        if node.node_ip:
            return node.node_ip
        if node.is_local:
            return "127.0.0.1"
        return node.host

    @property
    def head_ip(self) -> str:
        return self.node_ip(self.head)

    @property
    def gcs_address(self) -> str:
        return f"{self.head_ip}:{self.head.gcs_port}"

    def _fill(self, template: str) -> str:
        # literal replacement, never str.format: `{0}` or a width spec in a path must not run format's machinery
        return template.replace("{cluster_name}", self.cluster_name).replace("{uid}", str(os.getuid()))

    @property
    def temp_dir(self) -> str:
        return self._fill(self.ray.temp_dir)

    @property
    def legacy_temp_dir(self) -> Optional[str]:
        """Where a cluster started before the per-user default runs: only when the config keeps the default (a
        numeric cluster name is left out: /tmp/vc-<number> is a user's parent folder now)."""
        if self.ray.temp_dir != DEFAULT_TEMP_DIR or self.cluster_name.isdigit():
            return None
        return self._fill(LEGACY_TEMP_DIR)

    @property
    def token_file(self) -> Path:
        return Path(os.path.expanduser(self._fill(self.security.token_file)))

    def ray_executable(self, node: NodeSpec) -> str:
        if node.ray_executable:
            return node.ray_executable
        if self.ray.ray_executable:
            return self.ray.ray_executable
        return str(Path(sys.executable).with_name("ray"))

    def python_executable(self, node: NodeSpec) -> str:
        """The Python of the environment that holds `ray` on that node (same bin/ folder)."""
        ray = self.ray_executable(node)
        return str(Path(ray).with_name("python")) if "/" in ray else "python3"

    def dashboard_bind_host(self) -> str:
        return {"loopback": "127.0.0.1", "private": self.head_ip, "all": "0.0.0.0"}[self.security.dashboard_host]


def _check_semantics(spec: ClusterSpec) -> None:
    src = spec.source
    if not spec.cluster_name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(
            f"{src}: cluster_name `{spec.cluster_name}` may hold only letters, digits, '-' and '_'",
            "it names temp dirs and files on every node",
        )
    seen: dict[str, str] = {}
    for role, node in spec.nodes():
        ip = spec.node_ip(node)
        if ip in seen:
            raise ConfigError(f"{src}: {role} `{node.host}` has the same address {ip} as {seen[ip]}",
                              "each node needs its own address; set node_ip if two names point to one machine")
        seen[ip] = f"{role} `{node.host}`"
        if node.gpus is not None and node.gpus < 0:
            raise ConfigError(f"{src}: {role} `{node.host}`: gpus must be >= 0")
    if spec.workers and spec.head.is_local and not spec.head.node_ip:
        raise ConfigError(
            f"{src}: head is `{spec.head.host}` but the cluster has workers: they cannot reach 127.0.0.1",
            "set head.node_ip to this machine's address on the network the workers share",
        )
    _check_ports(spec)
    _check_local_ssh(spec)
    if len(spec.temp_dir) > MAX_TEMP_DIR:
        default = spec.ray.temp_dir == DEFAULT_TEMP_DIR
        raise ConfigError(f"{src}: ray.temp_dir `{spec.temp_dir}` is too long ({len(spec.temp_dir)} chars"
                          + (", the default for this cluster_name)" if default else ")"),
                          f"Ray's unix socket paths must stay under 107 chars: keep temp_dir under {MAX_TEMP_DIR}"
                          + (" (a shorter cluster_name, or set ray.temp_dir)" if default else ""))
    if not spec.temp_dir.startswith("/"):
        raise ConfigError(f"{src}: ray.temp_dir must be an absolute path, got `{spec.temp_dir}`")
    if os.path.normpath(spec.temp_dir) in ("/", "/tmp", "/var/tmp", "/dev/shm"):
        raise ConfigError(f"{src}: ray.temp_dir `{spec.temp_dir}` is a folder every user shares",
                          f"leave ray.temp_dir out for the default {DEFAULT_TEMP_DIR}")
    _check_ray_overrides(spec)


def _check_local_ssh(spec: ClusterSpec) -> None:
    """localhost, local and 127.0.0.1 mean this machine, run without SSH: SSH settings that only such a node would
    use are a mistake (a container's sshd forwarded to 127.0.0.1:2222 was silently never used) - said, not ignored."""
    src = spec.source
    fix = ("to run on this machine, leave the SSH settings out; to go through SSH, give the host's real address or "
           "name (for a port forwarded on this machine: 127.0.0.2 and the like reach it too)")
    for role, n in spec.nodes():
        own = [f for f, v in (("ssh_port", n.ssh_port), ("ssh_user", n.ssh_user), ("ssh_key_file", n.ssh_key_file))
               if v is not None]
        if n.is_local and own:
            raise ConfigError(f"{src}: {role}.host `{n.host}` runs on this machine without SSH, so its "
                              f"{', '.join(own)} would never be used", fix)
    if all(n.is_local for _, n in spec.nodes()):
        d, s = SshSpec(), spec.ssh
        set_ = [f"ssh.{f}" for f in ("port", "user", "key_file") if getattr(s, f) != getattr(d, f)]
        if set_:
            raise ConfigError(f"{src}: every node is this machine (head.host `{spec.head.host}`), run without SSH, "
                              f"so {', '.join(set_)} would never be used", fix)


def _pinned_ports(spec: ClusterSpec) -> list[tuple[str, int]]:
    """(field, port) of every port a node's Ray listens on besides its workers' range (the head's own first)."""
    h, p = spec.head, spec.ray.ports
    head = [("head.gcs_port", h.gcs_port), ("head.dashboard_port", h.dashboard_port),
            ("head.ray_client_port", h.ray_client_port)]
    return head + [(f"ray.ports.{name}", getattr(p, name)) for name in PortsSpec.__dataclass_fields__
                   if name not in ("min_worker", "max_worker")]


def _check_ports(spec: ClusterSpec) -> None:
    """Ports are checked at load, not by `ray start` an hour into `up` (Ray raises a ValueError there when a component
    port is in the worker range or taken twice): every port 1..65535, the worker range a range, each pinned port
    outside it and used once (on the head every one of them listens together)."""
    src = spec.source
    ssh = [("ssh.port", spec.ssh.port)] + [(f"{role} `{n.host}` ssh_port", n.ssh_port) for role, n in spec.nodes()
                                           if n.ssh_port is not None]
    p = spec.ray.ports
    for name, port in _pinned_ports(spec) + ssh + [("ray.ports.min_worker", p.min_worker),
                                                    ("ray.ports.max_worker", p.max_worker)]:
        if not 0 < port < 65536:
            raise ConfigError(f"{src}: {name} is {port}, not a port (1-65535)")
    if p.min_worker > p.max_worker:
        raise ConfigError(f"{src}: ray.ports.min_worker ({p.min_worker}) is above ray.ports.max_worker "
                          f"({p.max_worker})", "the worker range is min_worker..max_worker, e.g. 10002..19999")
    lo, hi = p.min_worker, p.max_worker
    inside = [(name, port) for name, port in _pinned_ports(spec) if lo <= port <= hi]
    if inside:
        what = ", ".join(f"{name} {port}" for name, port in inside)
        raise ConfigError(f"{src}: {what} {'is' if len(inside) == 1 else 'are'} inside the worker port range "
                          f"ray.ports.min_worker..max_worker ({lo}-{hi}): Ray gives those ports to worker processes "
                          "and refuses the overlap at `ray start`",
                          f"move {', '.join(n for n, _ in inside)} outside {lo}-{hi}, or narrow "
                          "ray.ports.min_worker/max_worker")
    seen: dict[int, str] = {}
    for name, port in _pinned_ports(spec):
        if port in seen:
            raise ConfigError(f"{src}: {name} and {seen[port]} are both {port}: each of Ray's ports needs its own",
                              f"change one of {name}, {seen[port]}")
        seen[port] = name


# `ray start` flags that the config sets from its own fields (Ray keeps the last of a repeated flag, so one in
# ray.start_args would win over the field and its checks), with the field to use instead
_OWN_FLAGS = {"--dashboard-host": "security.dashboard_host", "--ray-client-server-port": "head.ray_client_port",
              "--temp-dir": "ray.temp_dir", "--node-ip-address": "node_ip (per node)"}


def _check_ray_overrides(spec: ClusterSpec) -> None:
    """Settings that would undo security.* behind its back: Ray's auth variables in an env, and the flags above in
    ray.start_args (also as --flag=value), are refused with the setting that owns them."""
    src = spec.source
    envs = [("ray.env", spec.ray.env)] + [(f"{role} `{n.host}` env", n.env) for role, n in spec.nodes()]
    for where_, env in envs:
        for key in env:
            if key.startswith("RAY_AUTH_"):
                raise ConfigError(f"{src}: {where_} sets {key}: Ray's authentication is set by security.auth, "
                                  "not by the environment", f"remove {key}; use security.auth: token (or none)")
    for arg in spec.ray.start_args:
        flag = re.split(r"[=\s]", str(arg).strip(), maxsplit=1)[0]
        if flag in _OWN_FLAGS:
            raise ConfigError(f"{src}: ray.start_args holds {flag}: the config sets it from {_OWN_FLAGS[flag]}, "
                              "with its checks", f"remove it from ray.start_args; set {_OWN_FLAGS[flag]} instead")


def load_cluster(path: str | os.PathLike, overrides: list[str] | None = None, prepare=None) -> ClusterSpec:
    """Parse and validate a cluster.yaml; raises ConfigError with file:line on bad input. `prepare(data, source)`
    completes the raw config first: a launcher that finds its nodes (verl_cluster.launchers.load_cluster) fills them."""
    from dataclasses import replace

    spec = load(path, ClusterSpec, overrides, prepare=prepare)
    spec = replace(spec, source=str(path))
    _check_semantics(spec)
    return spec
