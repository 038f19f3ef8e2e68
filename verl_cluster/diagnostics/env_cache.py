"""The per-node backend environment (NCCL/Gloo/UCX) as `up` and `submit` use it: chosen from node facts by
`backend.select_backend`, remembered per cluster for an hour (detection costs an SSH round and a Python run on
every node; interfaces do not change between commands).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from verl_cluster.config.cluster import ClusterSpec


@dataclass(frozen=True)
class BackendEnv:
    by_host: dict[str, dict[str, str]]
    source: str  # "diagnostics" or "config network.interface" or "none"
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why each choice (from backend selection)
    complete: bool = True  # every node had facts

    def merged(self) -> tuple[dict[str, str], list[str]]:
        """One env for a Ray job (runtime_env applies on every node). A variable whose value differs by node
        (an interface named eth0 here and enp1s0 there) is left out: runtime_env would override every node
        with one value, while each node's Ray already carries its own from `up`, and job workers inherit it."""
        out: dict[str, str] = {}
        notes: list[str] = []
        keys = {k for env in self.by_host.values() for k in env}
        for key in sorted(keys):
            values = [env.get(key) for env in self.by_host.values()]
            distinct = list(dict.fromkeys(values))
            if len(distinct) == 1:
                out[key] = distinct[0]
            else:
                shown = ", ".join(str(v) for v in distinct if v is not None)
                notes.append(f"{key} differs between nodes ({shown}): not set in the job; each node's Ray keeps "
                             "the value `up` gave it")
        return out, notes


def config_interface_env(spec: ClusterSpec) -> dict[str, str]:
    """Fallback when node facts cannot be had: what the config says."""
    from verl_cluster.diagnostics.backend import config_network_env

    return config_network_env(spec)


CACHE_TTL_S = 3600.0


def _cache_path(spec: ClusterSpec) -> Path:
    return spec.token_file.parent / f"backend-env-{spec.cluster_name}.json"


def _cache_key(spec: ClusterSpec) -> str:
    nodes = [(n.host, spec.node_ip(n)) for _, n in spec.nodes()]
    return hashlib.sha256(json.dumps([nodes, spec.network.backend, spec.network.interface]).encode()).hexdigest()


def cached_backend_env(spec: ClusterSpec, refresh: bool = False, ttl_s: float = CACHE_TTL_S) -> BackendEnv:
    """backend_env(), remembered per cluster for an hour: detection probes every node over SSH (~2-3 s), and
    interfaces do not change between submits. `refresh` re-detects."""
    path = _cache_path(spec)
    if not refresh:
        try:
            d = json.loads(path.read_text())
            age = time.time() - d["at"]
            if d["key"] == _cache_key(spec) and 0 <= age < ttl_s:
                return BackendEnv(d["by_host"], f"{d['source']} (detected {age / 60:.0f} min ago)",
                                  reasons=d.get("reasons", []))
        except (OSError, ValueError, KeyError):
            pass
    env = backend_env(spec)
    if env.source == "diagnostics" and env.complete:  # never remember a choice made without every node
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"key": _cache_key(spec), "at": time.time(), "source": env.source,
                           "by_host": env.by_host, "reasons": env.reasons}, f)
        except OSError:
            pass  # a read-only home only costs the next submit a re-detection
    return env


def backend_env(spec: ClusterSpec) -> BackendEnv:
    from verl_cluster.diagnostics.backend import select_backend
    from verl_cluster.diagnostics.gather import gather_facts

    hosts = [n.host for _, n in spec.nodes()]
    try:
        choice = select_backend(spec, gather_facts(spec))
    except Exception as e:  # noqa: BLE001 - a probe failure must not block the fallback
        env = config_interface_env(spec)
        return BackendEnv({h: dict(env) for h in hosts}, "config network.interface" if env else "none",
                          [f"backend detection failed ({type(e).__name__}: {e}); using the config"])
    by_host = {h: dict(choice.env.get(h, {})) for h in hosts}
    missing = [h for h in hosts if h not in choice.env]
    notes = [f"no backend env for {', '.join(missing)} (no facts from it)"] if missing else []
    return BackendEnv(by_host, "diagnostics", notes, list(choice.reasons), complete=not missing)
