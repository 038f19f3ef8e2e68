"""Reshard verl's FSDP checkpoints (FSDP2 and FSDP1) to another world size (`verl-cluster reshard`)."""

from verl_cluster.reshard.apply import ReshardPlan, ReshardResult, apply_reshard, plan_reshard, reshard
from verl_cluster.reshard.layout import NotReshardable, read_step, resume_world_size_problem

__all__ = ["NotReshardable", "ReshardPlan", "ReshardResult", "apply_reshard", "plan_reshard", "read_step",
           "reshard", "resume_world_size_problem"]
