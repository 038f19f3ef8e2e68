"""Collective tests on a running cluster: gloo all-reduce (one actor per node, selected interface) and NCCL
all-reduce across every GPU. The driver (collective_driver.py) runs on the head with the node's Python."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import collective_driver
from verl_cluster.errors import RunnerError
from verl_cluster.runners import CommandRunner
from verl_cluster.runners.remote_python import run_python, script_source

DRIVER_SOURCE = script_source(collective_driver.__file__)
GLOO_SIZES = [1 << 20, 16 << 20]
NCCL_SIZES = [1 << 20, 64 << 20, 1 << 30]


@dataclass(frozen=True)
class CollectiveResult:
    backend: str  # gloo | nccl
    ok: bool
    world: int = 0
    results: list[dict] = field(default_factory=list)  # size, time_us, algbw_gbs, busbw_gbs, correct
    error: Optional[str] = None
    nodes: int = 0  # nodes the ranks ran on

    def to_json(self) -> dict:
        return {"backend": self.backend, "ok": self.ok, "world": self.world, "nodes": self.nodes, "error": self.error,
                "results": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
                            for r in self.results]}


def ray_env(spec: ClusterSpec, runner: CommandRunner) -> dict[str, str]:
    """What a driver on the head needs to join the cluster (token auth: the token file `up` put there)."""
    from verl_cluster.nodes.auth import node_token_path, ray_auth_env

    if spec.security.auth == "none":
        return ray_auth_env(spec)
    if spec.head.is_local:
        return ray_auth_env(spec)
    home = runner.run(["printenv", "HOME"], timeout=10).stdout.strip() or "/root"
    return ray_auth_env(spec, node_token_path(spec, home))


def collective_port(spec: ClusterSpec) -> int:
    """Rendezvous port: high in the worker range (open between nodes; Ray hands out from the bottom)."""
    return spec.ray.ports.max_worker - 3


def run_collective(spec: ClusterSpec, runners: Mapping[str, CommandRunner], env: Mapping[str, Mapping[str, str]],
                   backend: str = "gloo", sizes: Optional[list[int]] = None, iters: int = 5, warmup: int = 2,
                   timeout: float = 120.0) -> CollectiveResult:
    cfg = {
        "address": spec.gcs_address,
        "node_ip": spec.head_ip,
        "env_by_ip": {spec.node_ip(n): dict(env.get(n.host, {})) for _, n in spec.nodes()},
        "backend": backend,
        "sizes": sizes or (GLOO_SIZES if backend == "gloo" else NCCL_SIZES),
        "iters": iters,
        "warmup": warmup,
        "port": collective_port(spec),
        "timeout_s": timeout,
    }
    try:
        driver_env = {**ray_env(spec, runners[spec.head.host]), **env.get(spec.head.host, {})}
        data = run_python(runners[spec.head.host], spec.python_executable(spec.head), DRIVER_SOURCE,
                          [json.dumps(cfg)], env=driver_env, timeout=timeout + 60)
    except RunnerError as e:
        return CollectiveResult(backend, False, error=e.reason)
    return CollectiveResult(backend, bool(data.get("ok")), data.get("world", 0), data.get("results", []),
                            data.get("error"), len(set(data.get("ips") or [])))
