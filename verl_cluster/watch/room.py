"""After an OOM: plan the next attempt with room when the last plan ran a phase at the GPU's limit.

A plan "at the limit" (placement/planner.py) runs because verl trains with expandable segments, but it is the first
to fail when real sequences are longer than planned, and resuming with the same settings fails the same way. The
next attempt is planned with `placement.at_limit=false`; since the planner only goes to the limit when nothing it
chooses alone has room, that means the planner's best change that keeps what is trained (micro batches, token
budgets, offload, gradient checkpointing, Ulysses SP, rollout TP/eager — never the batch sizes, the nodes or LoRA),
cut down to the keys that are needed for room, each written into the run's overrides and the event.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec
from verl_cluster.placement.options import Option, OptionKind

ROOM = "placement.at_limit=false"


def same_training(option: Option) -> bool:
    """An option that changes how the step runs, not what is trained (nor on which nodes)."""
    return option.kind == OptionKind.SETTINGS and not option.adds_lora


def room_after_oom(load: Callable[[list[str]], JobSpec], overrides: list[str], spec: ClusterSpec,
                   facts: Optional[list] = None) -> tuple[list[str], str]:
    """(the overrides for the next attempt, what was decided, in words). `load(overrides)` builds the job;
    `facts`: the nodes' facts (gathered from `spec` when not given)."""
    from verl_cluster.verl_scripts.hydra_values import to_hydra
    from verl_cluster.diagnostics.cluster_facts import gather_node_facts
    from verl_cluster.placement import plan_job

    if ROOM in overrides:
        return overrides, "already planned with room (placement.at_limit=false): the same settings may run out of " \
                          "memory again (`verl-cluster plan` with your data's real lengths: --fill)"
    job = load(overrides)
    if not job.is_ray_only:
        return overrides, "not a verl trainer: no plan to change, resuming with the same settings"
    facts = gather_node_facts(spec) if facts is None else facts

    def fits(pairs: list[tuple[str, str]]) -> bool:
        return plan_job(load(overrides + [ROOM] + [f"{k}={v}" for k, v in pairs]), facts).feasible

    before = plan_job(job, facts)
    phases = ", ".join(before.at_limit_phases())
    if not phases:
        return overrides, "the plan had room for every phase: resuming with the same settings (lower the micro " \
                          "batches or token budgets if it happens again)"
    after = plan_job(load(overrides + [ROOM]), facts)
    was = {**before.overrides, **job.verl_overrides()}  # what the attempt that failed ran with
    words: list[tuple[str, str]] = []  # (verl key, value as Hydra reads it)
    if not after.feasible:
        option = next((o for o in after.options if same_training(o)), None)
        if option is None:
            return overrides, f"{phases} ran at the GPU's limit and nothing that keeps the training the same has " \
                              f"room: resuming with the same settings (`verl-cluster plan JOB {ROOM}` lists the " \
                              "changes that would)"
        words = [(k, to_hydra(v)) for k, v in option.overrides.items() if _differs(was.get(k), v)]
        for w in list(words):  # keep only what room needs: the others stay as the job had them
            if fits([x for x in words if x != w]):
                words.remove(w)
        if not fits(words):
            return overrides, f"{phases} ran at the GPU's limit; no change found with room: resuming with the same settings"
    changed = [f"{k}: {to_hydra(was[k]) if k in was else 'unset'} → {v}" for k, v in words]
    return overrides + [ROOM] + [f"{k}={v}" for k, v in words], (
        f"{phases} ran at the GPU's limit; the next attempts are planned with room"
        + (": " + "; ".join(changed) if changed else ""))


def _differs(a: Any, b: Any) -> bool:
    from verl_cluster.verl_scripts.hydra_values import to_hydra

    return a is None or to_hydra(a).lower() != to_hydra(b).lower()
