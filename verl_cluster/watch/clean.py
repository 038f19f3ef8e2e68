"""A clean slate before the next attempt: the previous attempt's job stopped, its Ray actors and placement groups
gone, and none of its processes left on any node holding GPU memory.

A verl attempt that died leaves more than its driver: Ray tears down its actors, but vLLM's engine and worker
processes are children of an actor, not actors, and may outlive it holding most of a GPU; a new attempt that
starts beside them fails its vLLM memory check or its placement group waits. Ray (State API) says when the
actors and placement groups are gone; the node script says which of the job's processes are left (they carry its
RAY_JOB_ID) and what NVML sees. What is left after a grace period is the dead attempt's alone: it is killed, and
named. The wait is bounded; what does not clear is named in the event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ClusterError
from verl_cluster.jobs import ray_jobs
from verl_cluster.nodes.agent import run_on_nodes

ALIVE_ACTOR = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING")


@dataclass
class Slate:
    clean: bool
    waited_s: float
    actors: list[str] = field(default_factory=list)  # "WorkerDict pid 123 (ALIVE)"
    groups: list[str] = field(default_factory=list)
    procs: list[str] = field(default_factory=list)  # "10.0.0.2 pid 77 VLLM::Worker_TP0 (S, 24.3 GiB on GPU 0)"
    killed: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)  # "10.0.0.2 GPU 0: 812 MiB used"

    def left(self) -> str:
        parts = self.actors + self.groups + self.procs
        return "; ".join(parts)[:600] or "nothing"

    def summary(self) -> str:
        head = f"clean after {self.waited_s:.1f}s" if self.clean else f"NOT clean after {self.waited_s:.1f}s: " \
               f"{self.left()}"
        kill = f"; killed {len(self.killed)} leftover process(es) of it: {'; '.join(self.killed)[:300]}" \
            if self.killed else ""
        gpu = f"; GPU memory now {', '.join(self.gpus)}" if self.gpus else ""
        return head + kill + gpu


def actor_pairs(actors: list[dict]) -> str:
    """The job's actors for the node script ("NODE_ID_PREFIX:PID:CLASS,..."): the first 12 hex digits of a node id
    tell nodes apart and keep the argument small for thousands of actors; the class is the process title's."""
    return ",".join(f"{a['node_id'][:12]}:{a['pid']}:{str(a.get('class_name') or '').rsplit('.', 1)[-1]}"
                    for a in actors if a.get("pid") and a.get("node_id"))


def _ray_left(api, ray_job_id: str) -> tuple[list[str], list[str], str]:
    rows = ray_jobs.state_list(api, "actors", (("job_id", ray_job_id),))
    actors = [f"{a.get('class_name', '?')} pid {a.get('pid', '?')} ({a.get('state')})"
              for a in rows if a.get("state") in ALIVE_ACTOR]
    groups = [f"placement group {str(g.get('placement_group_id', '?'))[:12]} ({g.get('state')})"
              for g in ray_jobs.state_list(api, "placement_groups")
              if g.get("creator_job_id") == ray_job_id and g.get("state") not in ("REMOVED",)]
    return actors, groups, actor_pairs(rows)


def _node_left(spec: ClusterSpec, ray_job_id: str, kill: bool, pairs: str = "") -> tuple[list[str], list[str],
                                                                                         list[str]]:
    """What the nodes still hold of the job: its processes (RAY_JOB_ID, or an actor of it by pid: a dead actor's
    process in a pooled worker can outlive Ray's record, holding its GPU memory), those killed, NVML per GPU."""
    procs, killed, gpus = [], [], []
    for r in run_on_nodes(spec, "jobprocs", lambda n: (n.spec.temp_dir, ray_job_id, "1" if kill else "0", pairs),
                          timeout=60):
        ip = r.host
        if not r.ok:
            procs.append(f"{ip}: cannot look ({r.reason[:120]})")
            continue
        for p in r.value["left"]:
            gpu = f", {p['gpu_mib'] / 1024:.1f} GiB on GPU {p['gpu']}" if p.get("gpu") is not None else ""
            procs.append(f"{ip} pid {p['pid']} {p['cmd'][:60]} ({p['state']}{gpu})")
        killed += [f"{ip} pid {k['pid']} {k['cmd'][:60]}" for k in r.value["killed"]]
        gpus += [f"{ip} GPU {g['index']}: {g['used_mib']} MiB used" for g in r.value["gpus"]]
    return procs, killed, gpus


def clean_slate(spec: ClusterSpec, api, sid: str, ray_job_id: str, timeout_s: float = 90.0, grace_s: float = 15.0,
                poll_s: float = 1.0, say: Callable[[str], None] = lambda _: None) -> Slate:
    """Stop the attempt `sid` if it still runs, then wait (at most timeout_s) until Ray and the nodes hold nothing
    of it. Processes of it still there after grace_s once Ray's actors are gone (or at the deadline) are killed."""
    t0 = time.monotonic()
    try:
        row = ray_jobs.job_info(api, sid)
        if row.status not in ray_jobs.TERMINAL:
            row = ray_jobs.stop(api, sid, wait_s=min(30.0, timeout_s))
        ray_job_id = ray_job_id or row.ray_job_id
    except ClusterError as e:
        say(f"could not stop {sid} through the Jobs API: {e.message}")
    if not ray_job_id:  # never reached Ray: nothing of it can be running
        return Slate(True, time.monotonic() - t0)
    killed_all: list[str] = []
    pairs = ""
    ray_clear_at = None
    said = False
    while True:
        waited = time.monotonic() - t0
        try:
            actors, groups, found = _ray_left(api, ray_job_id)
            pairs = found or pairs  # dead actors leave the table in time: keep the last pids seen
        except ClusterError as e:
            actors, groups = [f"Ray's State API did not answer ({e.message[:120]})"], []
        if not actors and not groups and ray_clear_at is None:
            ray_clear_at = time.monotonic()
        late = (ray_clear_at is not None and time.monotonic() - ray_clear_at >= grace_s) or waited >= timeout_s
        procs, killed, gpus = _node_left(spec, ray_job_id, kill=late, pairs=pairs)
        killed_all += killed
        if not actors and not groups and not procs:
            return Slate(True, time.monotonic() - t0, killed=killed_all, gpus=gpus)
        if waited >= timeout_s:
            return Slate(False, waited, actors, groups, procs, killed_all, gpus)
        if not said and waited >= 3:
            say(f"waiting for the previous attempt to let go: {'; '.join(actors + groups + procs)[:300]}")
            said = True
        time.sleep(poll_s)
