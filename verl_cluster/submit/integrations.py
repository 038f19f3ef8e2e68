"""Where submit meets the other parts (backend env from diagnostics, the placement plan, cluster status).

Each piece says which source it used, and why there is no plan when there is none.
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
    lengths: Optional[dict[str, Any]] = None  # the lengths planned at and their sources (placement/lengths.py)
    findings: tuple[Any, ...] = ()  # preflight findings of the planning: prompt lengths, planned at known lengths
    hint: str = ""  # what would make an infeasible plan fit
    predicted: Optional[dict[str, Any]] = None  # seconds per phase/step, host RAM: held against verl's metrics


def plan_for_job(job: JobSpec, spec: ClusterSpec, strategy: Optional[str] = None, fill: float = 1.0, *,
                 runners=None, timeout: float = 90.0):
    """Gather the live cluster's facts (every node of `spec`) and plan `job` on them (`plan_job`).
    Raises RunnerError for an unreachable node, ConfigError for bad input, PlanError when the hardware cannot
    be used at all (no GPUs, nodes with different GPU counts); a job that does not fit returns feasible=False."""
    from verl_cluster.diagnostics.cluster_facts import gather_node_facts
    from verl_cluster.placement import plan_job

    return plan_job(job, gather_node_facts(spec, runners=runners, timeout=timeout), strategy=strategy, fill=fill)


def placement_plan(job: JobSpec, spec: ClusterSpec, facts: Optional[list] = None) -> PlanInfo:
    """The planner's verl overrides for this job on this cluster's gathered facts (the job's own overrides win
    later), planned at the worst case and at the lengths known (the training prompts measured on the head node,
    an earlier run's logged lengths, placement.fill / mean_response_tokens): the worst case's plan when it fits,
    else the known lengths' with a warning. `facts`: the nodes' facts when already known (else gathered). Only
    verl's Ray trainers are planned; anything else gets an empty plan."""
    if not job.is_ray_only:
        return PlanInfo({}, None, {}, "no placement plan: not a verl Ray trainer")
    from verl_cluster.errors import ConfigError
    from verl_cluster.config.job import job_model_config
    from verl_cluster.placement.model_shape import resolve_shape

    try:  # no shape, no plan: the job runs with its own settings (what an imported verl script has anyway)
        resolve_shape(job.model.path, job.model.catalog, job_model_config(job))
    except ConfigError as e:
        return PlanInfo({}, None, {}, f"no placement plan: {e.message}; the job's own settings are used as they are",
                        unplanned=e.hint or "set model.catalog")
    from verl_cluster.facts.measured_bus import recorded
    from verl_cluster.submit.preflight import lengths_findings
    from verl_cluster.placement.length_plans import plan_lengths

    findings: tuple = ()  # the prompts measured stand even when the plan cannot be made (no GPUs, ...)
    try:
        facts, lengths, notes = _facts_and_lengths(job, spec, facts)
        findings = tuple(lengths_findings(job, lengths, notes))
        plans = plan_lengths(job, facts, lengths, bus=recorded(spec.cluster_name) if spec is not None else ())
        plan, host_note = _with_factors(job, plans.chosen, facts)
    except Exception as e:  # noqa: BLE001 - planning trouble becomes a preflight finding, not a crash
        msg = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
        return PlanInfo({}, False, {}, _strategy_note(job, facts) or f"placement planner: {msg}",
                        findings=findings, hint=getattr(e, "hint", None) or "")
    summary = plan.to_dict() if hasattr(plan, "to_dict") else {}
    findings += tuple(lengths_findings(job, None, (), plans))
    note = "placement planned" + (f" ({plan.strategy})" if getattr(plan, "strategy", None) else "")
    if host_note:
        note += f"; {host_note}"
    limit = plan.at_limit_phases()
    if limit:  # it runs, with no room for longer sequences: say so where the user looks before a long run
        note += f"; {', '.join(limit)} at the GPU's limit (`verl-cluster plan {job.source or 'JOB'}` says why)"
    if plans.verdict == "fits-at-known-lengths":
        note += f" at the lengths known (fill {plans.lengths.fill:.3g}; the worst case does not fit)"
    if not plan.feasible:
        note = _strategy_note(job, facts) or plans.refusal() or "infeasible"
    from verl_cluster.placement.hardware import flash_status

    flash, flash_note = flash_status(facts)
    if plan.not_covered:  # no verdict either way: a warning, the node/GPU counts, no memory-derived keys
        return PlanInfo(dict(plan.overrides or {}), None, summary, f"no memory verdict: {plan.not_covered}",
                        flash, flash_note, unplanned="the job's own Megatron settings are used; a first short run "
                        "(verl logs max_memory_reserved_gb each step) shows its memory", lengths=plans.lengths.to_dict(),
                        findings=findings)
    return PlanInfo(dict(plan.overrides or {}), bool(plan.feasible), summary, note, flash, flash_note,
                    lengths=plans.lengths.to_dict(), findings=findings,
                    hint="" if plan.feasible else plans.refusal_hint(), predicted=_with_machines(plan.predictions(),
                                                                                                   facts))


def _with_machines(predicted: dict[str, Any], facts) -> dict[str, Any]:
    """The predictions with the machines they are for (learned_host.machines_key: a run's host speed is kept under
    it for the next plan there). Nodes that are one machine (one hostname: namespace hosts, several Ray nodes on a
    box) show verl one figure for all of them: perf/cpu_memory_used_gb is that machine's used RAM, held against
    every node's plan together."""
    from verl_cluster.placement.learned_host import machines_key

    names = {getattr(f, "hostname", "") for f in facts or ()}
    if len(facts or ()) > 1 and len(names) == 1 and "" not in names:
        predicted = {**predicted, "shared_machine": True}
    key = machines_key(facts)
    return {**predicted, "machines": key} if key else predicted


def _with_factors(job: JobSpec, plan, facts) -> tuple[Any, str]:
    """The plan with the job's placement.factors applied, else the host factor placement.host_factor gives on these
    machines (learned_host.host_factors; its predictions are what the run is held against), and a few words on the
    host factor applied ("" when none)."""
    from verl_cluster.config.job import job_factors_path
    from verl_cluster.placement.factors import apply_factors, read_factors

    path = job_factors_path(job)
    if path:
        return apply_factors(plan, read_factors(path), path), ""
    (plan,), said = with_host_factor(job, facts, plan)
    return plan, said


def with_host_factor(job: JobSpec, facts, *plans) -> tuple[tuple[Any, ...], str]:
    """PLANS at the host factor placement.host_factor gives on these machines (the store read once for them all), and
    a few words on it ("" when it took on none). A plan with no step time kept at host factors (none fitted, a
    Megatron job's) stays as it is: nothing to say of the host."""
    from verl_cluster.placement.factors import apply_factors
    from verl_cluster.placement.learned_host import RUNS, host_factors, host_note
    from verl_cluster.records.host_speed import for_machines

    got = host_factors(job, facts, lambda key: for_machines(key, RUNS))
    if got is None:
        return plans, ""
    factors, source = got
    out = tuple(p if p is None or not (p.time or {}).get("by_host_factor") else
                apply_factors(p, factors, source, host_note(factors, source)) for p in plans)
    took = any(a is not b for a, b in zip(out, plans))
    return out, host_note(factors, source, short=True) if took else ""


def _facts_and_lengths(job: JobSpec, spec: ClusterSpec, facts: Optional[list]):
    """(the nodes' facts, the lengths known, notes): the facts and the prompt measurement (both over SSH) side by
    side. An unreachable node raises: it is a finding, not a smaller plan."""
    import concurrent.futures as cf

    from verl_cluster.submit.data_lengths import gather_lengths
    from verl_cluster.diagnostics.cluster_facts import gather_node_facts

    with cf.ThreadPoolExecutor(2) as pool:
        facts_f = pool.submit(gather_node_facts, spec) if facts is None else None
        lengths_f = pool.submit(gather_lengths, job, spec=spec)
        facts = facts_f.result() if facts_f is not None else facts
        lengths, notes = lengths_f.result()
    return facts, lengths, notes


def _strategy_note(job: JobSpec, facts) -> str:
    """When the job's placement.strategy is what makes the plan fail (another strategy fits, or the hardware has
    no pools for it), preflight's one-line message for it (field, file, why, fix); else ""."""
    if facts is None or job.placement.strategy in (None, "", "auto"):
        return ""
    from verl_cluster.submit.preflight import check_strategy

    try:
        found = check_strategy(job, facts)
    except Exception:  # noqa: BLE001 - the planner's own message stands
        return ""
    return next((f.message for f in found if f.level == "error"), "")


def plan_metadata(plan: PlanInfo, limit: int = 4000) -> str:
    doc: dict[str, Any] = {"feasible": plan.feasible, "overrides": plan.overrides, "note": plan.note}
    if plan.lengths:  # what the plan assumed of the sequences, for whoever reads the job later
        doc["lengths"] = {"fill": plan.lengths["fill"], "prompt_mean": plan.lengths["prompt"]["mean"],
                          "response_mean": plan.lengths["response"]["mean"]}
    if plan.predicted:  # so `logs`/`jobs --json` can pair them with what verl logs (placement/check_run.py)
        doc["predicted"] = dict(plan.predicted)
    # over the limit, give up the least needed first; a cut JSON text would be no metadata at all
    cuts = (lambda d: d.update(note=str(d["note"])[:300]), lambda d: d.get("predicted", {}).pop("by_host_factor", None),
            lambda d: d.get("predicted", {}).pop("by_fill", None),
            lambda d: d.pop("predicted", None), lambda d: d.pop("overrides", None))
    text = json.dumps(doc, default=str)
    for cut in cuts:
        if len(text) <= limit:
            break
        cut(doc)
        text = json.dumps(doc, default=str)
    return text


def plan_predictions(metadata: Optional[str]) -> Optional[dict[str, Any]]:
    """The plan's predictions kept in a job's metadata by plan_metadata (None: none kept, or not ours)."""
    try:
        doc = json.loads(metadata or "")
    except (ValueError, TypeError):
        return None
    got = doc.get("predicted") if isinstance(doc, dict) else None
    return got if isinstance(got, dict) else None
