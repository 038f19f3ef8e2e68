"""Where submit meets the other parts (backend env from diagnostics, the placement plan, cluster status).

Each piece tolerates its provider not being importable yet, and says which source it used.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec


@dataclass(frozen=True)
class BackendEnv:
    by_host: dict[str, dict[str, str]]
    source: str  # "diagnostics" or "config network.interface" or "none"
    notes: list[str] = field(default_factory=list)

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
    """Fallback when diagnostics are not available: the interface named in the config, if any."""
    iface = spec.network.interface
    if not iface or iface == "auto":
        return {}
    return {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}


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
                return BackendEnv(d["by_host"], f"{d['source']} (detected {age / 60:.0f} min ago)")
        except (OSError, ValueError, KeyError):
            pass
    env = backend_env(spec)
    if env.source == "diagnostics":
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"key": _cache_key(spec), "at": time.time(), "source": env.source,
                           "by_host": env.by_host}, f)
        except OSError:
            pass  # a read-only home only costs the next submit a re-detection
    return env


def backend_env(spec: ClusterSpec) -> BackendEnv:
    hosts = [n.host for _, n in spec.nodes()]
    try:
        from verl_cluster.diagnostics.backend import select_backend
        from verl_cluster.diagnostics.gather import gather_facts
    except ImportError:
        env = config_interface_env(spec)
        return BackendEnv({h: dict(env) for h in hosts}, "config network.interface" if env else "none")
    try:
        choice = select_backend(spec, gather_facts(spec))
    except Exception as e:  # noqa: BLE001 - a probe failure must not block the fallback
        env = config_interface_env(spec)
        return BackendEnv({h: dict(env) for h in hosts}, "config network.interface" if env else "none",
                          [f"backend detection failed ({type(e).__name__}: {e}); using the config"])
    by_host = {h: dict(choice.env.get(h, {})) for h in hosts}
    return BackendEnv(by_host, "diagnostics")


@dataclass(frozen=True)
class PlanInfo:
    overrides: dict[str, Any]
    feasible: Optional[bool]
    summary: dict[str, Any]
    note: str


def placement_plan(job: JobSpec, spec: ClusterSpec) -> PlanInfo:
    """The planner's verl overrides for this job on this cluster's gathered facts (the job's own overrides win
    later). Only verl's Ray trainers are planned; anything else gets an empty plan."""
    if not (job.entrypoint or "").startswith("verl.trainer.main_"):
        return PlanInfo({}, None, {}, "no placement plan: not a verl Ray trainer")
    try:
        from verl_cluster.placement import plan_for_job
    except ImportError:
        return PlanInfo({}, None, {}, "placement planner not available: the job's own overrides are used")
    try:
        plan = plan_for_job(job, spec)  # every node's facts; an unreachable node is a finding, not a smaller plan
    except Exception as e:  # noqa: BLE001 - planning trouble becomes a preflight finding, not a crash
        msg = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
        return PlanInfo({}, False, {}, f"placement planner: {msg}")
    summary = plan.to_dict() if hasattr(plan, "to_dict") else {}
    note = "placement planned" + (f" ({plan.strategy})" if getattr(plan, "strategy", None) else "")
    if not plan.feasible:
        note = "; ".join(list(getattr(plan, "problems", []) or [])[:3]) or "infeasible"
    return PlanInfo(dict(plan.overrides or {}), bool(plan.feasible), summary, note)


def plan_metadata(plan: PlanInfo, limit: int = 4000) -> str:
    text = json.dumps({"feasible": plan.feasible, "overrides": plan.overrides, "note": plan.note}, default=str)
    return text[:limit]
