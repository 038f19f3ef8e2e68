"""Placement planner: which GPUs each verl role gets, memory per GPU, and the verl overrides that make it so.

Library API (pure: no probing; facts come in as arguments):

    from verl_cluster.placement import plan_job, parse_gpus, Plan

    facts = parse_gpus("2x8xH100-80GB")          # or list[NodeFacts] from the diagnostics gatherer
    p: Plan = plan_job(job, facts)               # job: verl_cluster.config.job.JobSpec
    p.feasible, p.strategy, p.reasons, p.problems, p.fixes
    p.overrides                                  # {verl key: value}, verl 0.9 names: merge into the job's
    p.role("actor").gpus, p.role("actor").memory_gib_per_gpu
    p.to_dict()                                  # the `plan --json` document
    p.raise_if_infeasible()                      # PlanError with the numbers and the fixes

`plan_job(job, facts, strategy=None, fill=1.0)`: strategy colocate | split | separate-reward | auto (default:
job.placement.strategy); fill is the average share of prompt+response a sequence uses (1.0 = worst case).
Bad input raises ConfigError; unusable hardware (nodes with different GPU counts) raises PlanError; a job
that does not fit returns a Plan with feasible=False. The memory model is documented in docs/placement.md.

`plan_for_job(job, spec, strategy=None, fill=1.0) -> Plan` is the one call that probes: it gathers the facts of
every node of a live cluster (verl_cluster.diagnostics.gather.gather_facts, over SSH/local runners) and plans on
them. An unreachable node raises the RunnerError that names it and says why (the plan would otherwise be made
for fewer nodes than verl will use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from verl_cluster.facts.model import NodeFacts
from verl_cluster.placement.gpus import parse_gpus
from verl_cluster.placement.model_shape import ModelShape, catalog_shape, resolve_shape, shape_from_hf_config
from verl_cluster.placement.plan import Component, GpuSlot, PhasePlan, Plan, RolePlan, plan

if TYPE_CHECKING:
    from verl_cluster.config.cluster import ClusterSpec
    from verl_cluster.config.job import JobSpec

plan_job = plan


def gather_node_facts(spec: "ClusterSpec", *, runners=None, timeout: float = 90.0) -> list["NodeFacts"]:
    """Facts of every node of `spec`, in the spec's node order; the first unreachable node raises its
    RunnerError (the others that failed are named in its hint)."""
    from verl_cluster.diagnostics.gather import gather_facts
    from verl_cluster.errors import RunnerError

    got = gather_facts(spec, runners, timeout=timeout)
    hosts = [node.host for _, node in spec.nodes()]
    failed = [(h, got.get(h)) for h in hosts if not isinstance(got.get(h), NodeFacts)]
    if failed:
        host, e = failed[0]
        reason = e.reason if isinstance(e, RunnerError) else (str(e) if e else "no facts came back")
        others = ", ".join(h for h, _ in failed[1:])
        hint = (f"also unreachable: {others}. " if others else "") + \
            "`verl-cluster doctor CLUSTER.yaml` shows why; or plan from recorded facts with --facts FILE.json"
        raise RunnerError(host, f"cannot gather facts for the plan: {reason}", hint)
    from verl_cluster.facts.ray_view import as_ray_sees

    # the GPUs Ray is given on each node (its `gpus:` / the allocation's count, its CUDA_VISIBLE_DEVICES), not
    # every GPU NVML lists: verl's placement groups ask Ray for them
    return [as_ray_sees(got[h], node.gpus, {**spec.ray.env, **node.env})  # type: ignore[arg-type]
            for (_, node), h in zip(spec.nodes(), hosts)]


def plan_for_job(job: "JobSpec", spec: "ClusterSpec", strategy: Optional[str] = None, fill: float = 1.0, *,
                 runners=None, timeout: float = 90.0) -> Plan:
    """Gather the live cluster's facts (every node of `spec`) and plan `job` on them (`plan_job`).
    Raises RunnerError for an unreachable node, ConfigError for bad input, PlanError when the hardware cannot
    be used at all (no GPUs, nodes with different GPU counts); a job that does not fit returns feasible=False."""
    return plan_job(job, gather_node_facts(spec, runners=runners, timeout=timeout), strategy=strategy, fill=fill)


__all__ = [
    "Component", "GpuSlot", "ModelShape", "PhasePlan", "Plan", "RolePlan", "catalog_shape", "gather_node_facts",
    "parse_gpus", "plan", "plan_for_job", "plan_job", "resolve_shape", "shape_from_hf_config",
]
