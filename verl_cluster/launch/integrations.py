"""Where submit meets the other parts (backend env from diagnostics, the placement plan, cluster status).

Each piece tolerates its provider not being importable yet, and says which source it used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec
from verl_cluster.diagnostics.env_cache import (  # noqa: F401 - re-exported for submit
    BackendEnv,
    backend_env,
    cached_backend_env,
    config_interface_env,
)


@dataclass(frozen=True)
class PlanInfo:
    overrides: dict[str, Any]
    feasible: Optional[bool]
    summary: dict[str, Any]
    note: str
    flash_attn: Optional[bool] = None  # the nodes' flash-attn: False missing/broken somewhere, None unknown
    flash_attn_note: str = ""
    unplanned: str = ""  # why there is no plan and what would give one (a warning, not an error)


def placement_plan(job: JobSpec, spec: ClusterSpec) -> PlanInfo:
    """The planner's verl overrides for this job on this cluster's gathered facts (the job's own overrides win
    later). Only verl's Ray trainers are planned; anything else gets an empty plan."""
    if not (job.entrypoint or "").startswith("verl.trainer.main_"):
        return PlanInfo({}, None, {}, "no placement plan: not a verl Ray trainer")
    try:
        from verl_cluster.placement import gather_node_facts, plan_job
    except ImportError:
        return PlanInfo({}, None, {}, "placement planner not available: the job's own overrides are used")
    from verl_cluster.errors import ConfigError
    from verl_cluster.placement.model_shape import resolve_shape

    try:  # no shape, no plan: the job runs with its own settings (what an imported verl script has anyway)
        resolve_shape(job.model.path, job.model.catalog)
    except ConfigError as e:
        return PlanInfo({}, None, {}, f"no placement plan: {e.message}; the job's own settings are used as they are",
                        unplanned=e.hint or "set model.catalog")
    facts = None
    try:
        facts = gather_node_facts(spec)  # every node's facts; an unreachable node is a finding, not a smaller plan
        plan = plan_job(job, facts)
    except Exception as e:  # noqa: BLE001 - planning trouble becomes a preflight finding, not a crash
        msg = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
        return PlanInfo({}, False, {}, _strategy_note(job, facts) or f"placement planner: {msg}")
    summary = plan.to_dict() if hasattr(plan, "to_dict") else {}
    note = "placement planned" + (f" ({plan.strategy})" if getattr(plan, "strategy", None) else "")
    limit = plan.at_limit_phases()
    if limit:  # it runs, with no room for longer sequences: say so where the user looks before a long run
        note += f"; {', '.join(limit)} at the GPU's limit (`verl-cluster plan {job.source or 'JOB'}` says why)"
    if not plan.feasible:
        note = _strategy_note(job, facts) or "; ".join(list(getattr(plan, "problems", []) or [])[:3]) or "infeasible"
    from verl_cluster.placement.hardware import flash_status

    flash, flash_note = flash_status(facts)
    return PlanInfo(dict(plan.overrides or {}), bool(plan.feasible), summary, note, flash, flash_note)


def _strategy_note(job: JobSpec, facts) -> str:
    """When the job's placement.strategy is what makes the plan fail (another strategy fits, or the hardware has
    no pools for it), preflight's one-line message for it (field, file, why, fix); else ""."""
    if facts is None or job.placement.strategy in (None, "", "auto"):
        return ""
    from verl_cluster.launch.preflight import check_strategy

    try:
        found = check_strategy(job, facts)
    except Exception:  # noqa: BLE001 - the planner's own message stands
        return ""
    return next((f.message for f in found if f.level == "error"), "")


def plan_metadata(plan: PlanInfo, limit: int = 4000) -> str:
    text = json.dumps({"feasible": plan.feasible, "overrides": plan.overrides, "note": plan.note}, default=str)
    return text[:limit]
