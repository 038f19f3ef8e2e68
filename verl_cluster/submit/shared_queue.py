"""One verl job at a time where verl keeps cluster-wide state: verl 0.9's default trainer (`trainer.use_v1`, on
unless set false) moves its batches through TransferQueue, whose controller is a Ray actor named
`TransferQueueController` in the fixed Ray namespace `transfer_queue`: one per Ray cluster, not per job.
`transfer_queue.init` attaches to the controller it finds, so a second verl job on the cluster shares the first
one's queue (its batches come back short, padded with synthetic samples) and hangs when the first job ends and
`transfer_queue.close` kills the controller. Seen on 4x H200 (2026-11-28): every run going when another ended
stopped at that step. Submit checks for a live controller before it sends a verl job that would use one.

Clusters on one machine share its /tmp, where verl's colocated rollout names the sockets it hands weights to vLLM
through by the Ray job id (`/tmp/rl-colocate-zmq-<job id>-replica-R-rank-K.sock`, bound afresh at each update);
job ids count from 1 in every GCS, so verl jobs of two clusters on one machine can take each other's sockets in
the middle of an update. Submit warns when another cluster of ours runs Ray on a node of the job's.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.submit.findings import Finding

CONTROLLER = "TransferQueueController"
NAMESPACE = "transfer_queue"
FALSE = ("false", "0", "no", "off")


def runs_main_ppo(job: JobSpec) -> bool:
    """verl's PPO/GRPO trainer: a colocated vLLM rollout, and TransferQueue unless the legacy trainer is chosen."""
    return (job.entrypoint or "").startswith("verl.trainer.main_ppo")


def uses_transfer_queue(job: JobSpec, overrides: Mapping[str, Any]) -> bool:
    """verl's PPO/GRPO trainer with the V1 trainer (verl 0.9's default) runs TransferQueue."""
    if not runs_main_ppo(job):
        return False
    return str(overrides.get("trainer.use_v1", "true")).strip().lower() not in FALSE


def queue_owners(actors: list[dict], jobs: list[Any]) -> list[str]:
    """The submission ids (else Ray job ids) whose live TransferQueue controller is on the cluster."""
    by_ray_id = {getattr(j, "ray_job_id", ""): j.submission_id for j in jobs if getattr(j, "ray_job_id", "")}
    out = []
    for a in actors:
        if a.get("name") != CONTROLLER or a.get("state") != "ALIVE":
            continue
        if a.get("ray_namespace") not in (None, NAMESPACE):
            continue
        jid = str(a.get("job_id") or "")
        out.append(by_ray_id.get(jid) or (f"Ray job {jid}" if jid else "a job"))
    return sorted(set(out))


def finding(owners: list[str]) -> Optional[Finding]:
    if not owners:
        return None
    who = ", ".join(owners)
    return Finding("error", "shared-queue",
                   f"{who} is running verl's TransferQueue on this cluster ({CONTROLLER} in Ray namespace "
                   f"{NAMESPACE}: one per Ray cluster). This job would attach to that queue, share its batches "
                   "and hang when that job ends",
                   f"wait for it (`verl-cluster logs {owners[0]} --follow`), stop it (`verl-cluster stop "
                   f"{owners[0]}`), or submit to a cluster of other machines (one on this machine's other GPUs "
                   "shares /tmp, where verl's weight-sync sockets are named by Ray job ids every cluster counts from "
                   "1); trainer.use_v1=false runs verl's legacy trainer, which has no queue")


def check_shared_queue(spec: Any, job: JobSpec, overrides: Mapping[str, Any]) -> list[Finding]:
    """An error when a verl job that would use TransferQueue meets a live controller on the cluster."""
    if not uses_transfer_queue(job, overrides):
        return []
    from verl_cluster.errors import ClusterError
    from verl_cluster.jobs import ray_jobs

    try:
        with ray_jobs.connect(spec) as api:
            actors = ray_jobs.state_list(api, "actors", (("name", CONTROLLER),), limit=100, timeout_s=15.0)
            jobs = ray_jobs.list_jobs(api) if actors else []
    except ClusterError as e:
        return [Finding("skipped", "shared-queue", f"could not ask Ray for a running TransferQueue: {e.message}")]
    found = finding(queue_owners(actors, jobs))
    return [found] if found else [Finding("ok", "shared-queue", "no other verl job's TransferQueue on the cluster")]


def check_shared_host(job: JobSpec, status: Any) -> list[Finding]:
    """A warning when a node of the cluster also runs another cluster of ours (status' other_clusters)."""
    if not runs_main_ppo(job) or status is None:
        return []
    shared = [(n.host, n.other_clusters) for n in status.nodes if getattr(n, "other_clusters", None)]
    if not shared:
        return []
    where = "; ".join(f"{h}: {', '.join(names)}" for h, names in shared)
    first = shared[0][1][0]
    return [Finding("warning", "shared-host",
                    f"another cluster of ours runs Ray on this job's machines ({where}): verl names the sockets it "
                    "hands weights to vLLM through /tmp/rl-colocate-zmq-<Ray job id>-..., and every cluster counts "
                    "job ids from 1, so verl jobs of both clusters can take each other's sockets mid-update",
                    f"one cluster per machine for verl jobs: `verl-cluster down -c {first}` when it has no job, or "
                    "give the clusters machines of their own")]
