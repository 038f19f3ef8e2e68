"""Placement planner: which GPUs each verl role gets, memory per GPU, and the verl overrides that make it so.

Pure: facts come in as arguments, nothing here reaches a node (a live cluster's facts:
`verl_cluster.diagnostics.cluster_facts.gather_node_facts`).

    from verl_cluster.placement import plan_job, parse_gpus, Plan

    facts = parse_gpus("2x8xH100-80GB")          # or list[NodeFacts] gathered from the nodes
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
"""

from __future__ import annotations

from verl_cluster.placement.gpus import parse_gpus
from verl_cluster.placement.model_shape import ModelShape, catalog_shape, resolve_shape, shape_from_hf_config
from verl_cluster.placement.plan import Component, GpuSlot, PhasePlan, Plan, RolePlan, plan

plan_job = plan

__all__ = [
    "Component", "GpuSlot", "ModelShape", "PhasePlan", "Plan", "RolePlan", "catalog_shape", "parse_gpus", "plan",
    "plan_job", "resolve_shape", "shape_from_hf_config",
]
