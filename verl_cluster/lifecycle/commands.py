"""What `up` runs on each node, as data: argv + environment, built purely from the spec.

`--dry-run` prints these; `up` applies them. The fingerprint tells a running node whether its config changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from verl_cluster.config.cluster import ClusterSpec, NodeSpec
from verl_cluster.config.names import masked_env
from verl_cluster.diagnostics.backend import config_network_env
from verl_cluster.launchers import launcher_for
from verl_cluster.nodes.auth import ray_auth_env, remote_token_path


@dataclass(frozen=True)
class NodeCommand:
    host: str
    role: str  # head | worker
    ip: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    expected_gpus: int | None = None

    @property
    def fingerprint(self) -> str:
        """Stable hash of what defines this node's Ray (not where its token file happens to live)."""
        env = {k: v for k, v in self.env.items() if k != "RAY_AUTH_TOKEN_PATH"}
        blob = json.dumps([list(self.argv), sorted(env.items())])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def masked_env(self) -> dict[str, str]:
        return masked_env(self.env)

    def to_json(self) -> dict:
        return {"host": self.host, "role": self.role, "ip": self.ip, "argv": list(self.argv),
                "env": self.masked_env(), "fingerprint": self.fingerprint}


def port_args(spec: ClusterSpec) -> list[str]:
    p = spec.ray.ports
    return ["--node-manager-port", str(p.node_manager), "--object-manager-port", str(p.object_manager),
            "--dashboard-agent-grpc-port", str(p.dashboard_agent_grpc),
            "--dashboard-agent-listen-port", str(p.dashboard_agent_listen),
            "--metrics-export-port", str(p.metrics_export), "--runtime-env-agent-port", str(p.runtime_env_agent),
            "--min-worker-port", str(p.min_worker), "--max-worker-port", str(p.max_worker)]


def head_port_env(spec: ClusterSpec, role: str) -> dict[str, str]:
    """Ports `ray start` has no flag for: read from the environment by the head's dashboard and monitor."""
    if role != "head":
        return {}
    p = spec.ray.ports
    return {"DASHBOARD_METRIC_PORT": str(p.dashboard_metrics), "AUTOSCALER_METRIC_PORT": str(p.autoscaler_metrics)}


def start_command(spec: ClusterSpec, role: str, node: NodeSpec, *, token_path: str | None = None,
                  extra_env: dict[str, str] | None = None) -> NodeCommand:
    ip = spec.node_ip(node)
    argv = [spec.ray_executable(node), "start"]
    if role == "head":
        h = spec.head
        argv += ["--head", "--port", str(h.gcs_port), "--dashboard-host", spec.dashboard_bind_host(),
                 "--dashboard-port", str(h.dashboard_port), "--ray-client-server-port", str(h.ray_client_port)]
    else:
        argv += ["--address", spec.gcs_address]
    argv += ["--node-ip-address", ip, "--temp-dir", spec.temp_dir, "--disable-usage-stats"]
    argv += port_args(spec)
    if spec.ray.object_store_memory:
        argv += ["--object-store-memory", str(spec.ray.object_store_memory)]
    if node.gpus is not None:
        argv += ["--num-gpus", str(node.gpus)]
    if node.cpus is not None:
        argv += ["--num-cpus", str(node.cpus)]
    if node.resources:
        argv += ["--resources", json.dumps(dict(node.resources), sort_keys=True)]
    if node.labels:
        argv += ["--labels", ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))]
    argv += list(spec.ray.start_args)
    argv += launcher_for(spec).start_flags()
    env = {**ray_auth_env(spec, token_path or remote_token_path(spec)), **head_port_env(spec, role), **spec.ray.env,
           **node.env, **(extra_env or {})}
    return NodeCommand(node.host, role, ip, tuple(argv), env, node.gpus)


def plan_start(spec: ClusterSpec, node_env: dict[str, dict[str, str]] | None = None,
               token_paths: dict[str, str] | None = None) -> list[NodeCommand]:
    """Start commands for every node, head first."""
    base = config_network_env(spec)
    return [start_command(spec, role, node, token_path=(token_paths or {}).get(node.host),
                          extra_env={**base, **(node_env or {}).get(node.host, {})})
            for role, node in spec.nodes()]
