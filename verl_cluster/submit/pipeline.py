"""`submit` as a library: decide the launcher, gather inputs, preflight, build the request (plan), then apply.

plan_submission() touches the cluster only to read (status, file probes); nothing is started until
apply_* is called.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec, is_verl_module
from verl_cluster.errors import ClusterError, ConfigError
from verl_cluster.launchers import load_cluster
from verl_cluster.submit.integrations import cached_backend_env, placement_plan, plan_metadata
from verl_cluster.submit.preflight import (Finding, PreflightReport, check_flash_attn_needs, expand_paths,
                                          run_preflight)
from verl_cluster.submit.checkpoint_checks import checkpoint_findings
from verl_cluster.jobs.launcher import JobLauncher, LaunchInputs, job_launcher_for
from verl_cluster.jobs.request import NotApplied, RayJobRequest, TorchrunRequest, merge_overrides, secret_values

def warm_imports() -> None:
    """Import Ray's job client in the background while the checks run (it takes ~1-2 s)."""
    def load() -> None:
        try:
            import ray.job_submission  # noqa: F401
        except ImportError:
            pass

    threading.Thread(target=load, daemon=True).start()


def needs_ray(job: JobSpec) -> bool:
    """Entrypoints that only run as Ray drivers (verl's PPO/GRPO trainers, its Ray SFT trainer)."""
    return job.is_ray_only or (is_verl_module(job.entrypoint) and (job.entrypoint or "").endswith("_ray"))


def decide_launcher(job: JobSpec, ray_healthy: bool, cluster_file: str, why_unhealthy: str = "") -> str:
    """'ray' or 'torchrun' for this job, given whether a healthy Ray cluster is there."""
    down = f"no healthy Ray cluster ({why_unhealthy})" if why_unhealthy else "no healthy Ray cluster"
    if job.launcher == "torchrun":
        return "torchrun"
    if job.launcher == "ray" or needs_ray(job):
        if not ray_healthy:
            what = f"`{job.entrypoint}` runs on Ray" if needs_ray(job) else "launcher is ray"
            raise ClusterError(f"{what}, but there is {down}", f"start it first: verl-cluster up {cluster_file}")
        return "ray"
    return "ray" if ray_healthy else "torchrun"


@dataclass(frozen=True)
class Submission:
    job: JobSpec
    spec: ClusterSpec
    cluster_file: str
    launcher: str
    request: Union[RayJobRequest, TorchrunRequest]
    preflight: PreflightReport
    notes: list[str] = field(default_factory=list)
    not_applied: list[NotApplied] = field(default_factory=list)  # planner suggestions the job's own keys beat

    @property
    def job_launcher(self) -> JobLauncher:
        return job_launcher_for(self.launcher)

    def describe(self) -> dict[str, Any]:
        return {"job": self.job.name, "source": self.job.source, "cluster": self.cluster_file,
                "launcher": self.launcher, "request": self.request.describe(),
                "preflight": self.preflight.to_json(), "notes": list(self.notes),
                "plan_not_applied": [{"key": n.key, "value": n.value, "reason": n.reason} for n in self.not_applied]}


def _status(spec: ClusterSpec):
    """(ClusterStatus or None, why the head is not usable or "")."""
    from verl_cluster.lifecycle.status import cluster_status

    try:
        st = cluster_status(spec, with_jobs=False)
    except Exception as e:  # noqa: BLE001 - an unreachable head means "no cluster" here
        return None, f"{type(e).__name__}: {e}"
    head = next((n for n in st.nodes if n.role == "head"), None)
    if head is None or not head.alive:
        return st, f"head {spec.head.host}: {head.state + (' - ' + head.reason if head.reason else '') if head else '?'}"
    return st, ""


def _jobs_api_up(spec: ClusterSpec):
    """(None, why-not or "") from one Jobs API round trip: enough to know Ray can take a job (~0.3 s, where the
    full status probes every node over SSH in ~3 s)."""
    from verl_cluster.jobs import ray_jobs

    try:
        with ray_jobs.connect(spec):
            return None, ""
    except ClusterError as e:
        if "refused our token" in e.message:
            raise
        return None, e.message


def plan_submission(job: JobSpec, cluster_file: str, *, launcher: Optional[str] = None,
                    run_checks: bool = True, environ=None, refresh_backend: bool = False,
                    spec: Optional[ClusterSpec] = None) -> Submission:
    """`spec`: the cluster as loaded (watch passes one with the nodes a run continues on), else cluster_file's."""
    spec = spec or load_cluster(cluster_file)
    from verl_cluster.placement.lengths import check_placement_lengths

    check_placement_lengths(job)  # a bad placement.fill / mean_response_tokens is bad input (exit 2), before any probe
    from verl_cluster.placement.learned_host import stated

    stated(job)  # and a bad placement.host_factor
    if launcher:
        from dataclasses import replace

        job = replace(job, launcher=launcher)
    # the slow reads (SSH probes of every node) run side by side
    # Full status (every node over SSH) only where preflight needs its GPU counts; otherwise one Jobs API call.
    want_status = needs_ray(job) and job.launcher != "torchrun"
    probe = _status if want_status else (_jobs_api_up if job.launcher != "torchrun" else lambda s: (None, "skipped"))
    with cf.ThreadPoolExecutor(3) as pool:
        status_f = pool.submit(probe, spec)
        benv_f = pool.submit(cached_backend_env, spec, refresh_backend)
        plan_f = pool.submit(placement_plan, job, spec)
        status, why = status_f.result()
        benv, plan = benv_f.result(), plan_f.result()
    chosen = decide_launcher(job, not why, cluster_file, why)
    launcher = job_launcher_for(chosen)
    notes: list[str] = []
    extra: list[Finding] = []
    if status is not None and not why and launcher.on_cluster_ray:
        for n in status.nodes:
            if not n.alive:
                extra.append(Finding("warning", "cluster", f"{n.role} {n.host} is {n.state}"
                                     + (f": {n.reason}" if n.reason else ""), f"verl-cluster up {cluster_file}"))
    notes.append(f"backend env from {benv.source}")
    notes += benv.notes
    notes.append(plan.note)
    if plan.feasible is None and plan.unplanned:
        extra.append(Finding("warning", "placement", plan.note, plan.unplanned))
    if plan.feasible is False:
        extra.append(Finding("error", "placement", f"the placement planner finds no feasible plan: {plan.note}",
                             plan.hint or f"verl-cluster plan {job.source}"))
    extra += plan.findings  # the prompts measured; a plan that fits only at the lengths known says so
    extra += check_flash_attn_needs(job, plan.flash_attn, plan.flash_attn_note)
    overrides, not_applied = merge_overrides(job, plan.overrides)
    secrets = secret_values(job, os.environ if environ is None else environ)
    if run_checks:
        report = run_preflight(spec, job, overrides, status if launcher.on_cluster_ray else None, extra)
    else:  # the paths are still expanded: verl cannot open `~` whoever skipped the checks
        paths, found = expand_paths(spec, job, overrides)
        report = PreflightReport([Finding("warning" if f.level == "error" else f.level, f.check, f.message, f.hint)
                                  for f in extra] + found + [Finding("skipped", "preflight", "--skip-preflight")], paths)
    overrides = report.with_paths(overrides)  # verl opens paths as written: `~` and $VAR as the nodes expand them
    if run_checks and launcher.on_cluster_ray:
        report.findings.extend(checkpoint_findings(job, overrides))
    env: dict = {}
    gpus = None
    if launcher.on_cluster_ray:
        env, warnings = benv.merged()
        notes += warnings
    elif status is not None:
        counts = [int(n.gpus) for n in status.nodes if n.alive]
        gpus = min(counts) if counts and min(counts) > 0 else None
    elif job.torchrun.nproc_per_node is None and spec.head.gpus is None:
        gpus = _nodes_gpu_count(spec)  # "default: the nodes' GPU count", not 1
    req = launcher.request(job, spec, LaunchInputs(overrides, benv.by_host, env, secrets, plan_metadata(plan), gpus))
    return Submission(job, spec, cluster_file, chosen, req, report, notes, not_applied)


def _nodes_gpu_count(spec: ClusterSpec) -> Optional[int]:
    """The smallest GPU count among the nodes that answer (NVML via the diagnostics probe); None without GPUs."""
    from verl_cluster.diagnostics import gather
    from verl_cluster.facts.model import NodeFacts

    counts = [len(f.gpus) for f in gather.gather_facts(spec).values() if isinstance(f, NodeFacts)]
    return min(counts) if counts and min(counts) > 0 else None


BAD_INPUT_CHECKS = ("data", "model", "verl-config")  # the user's own files and keys


def preflight_exit_code(report: PreflightReport) -> int:
    """2 when the job's own input is wrong, 1 when only the cluster cannot run it (docs/cli.md). With both, 2 when
    a data or model path or a verl key is wrong (fixed first, whatever the cluster lacks); verl rejecting the config
    as a whole then is not enough: the plan that failed on the cluster would have filled in what it misses."""
    errors = report.errors
    own = [f for f in errors if f.check in BAD_INPUT_CHECKS]
    if not own or len(own) == len(errors):
        return 2 if own else 1
    return 2 if any(f.check != "verl-config" or f.message.startswith("unknown verl key") for f in own) else 1


def check_cluster_file(path: str) -> None:
    if not Path(path).exists():
        raise ConfigError(f"{path}: cluster file not found",
                          "pass --cluster FILE, or set `cluster:` in the job file (relative to it)")
