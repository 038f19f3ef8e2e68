"""The hang bundle: what verl's maintainers ask for in a hang report, collected from every node of the run in one
go before the hung attempt is stopped — py-spy stacks of the driver, every worker and vLLM's processes, Ray's actor
table for the job, the last lines of each worker's log, and NVML per GPU (who holds what) — into
bundle-<attempt>/ in the run folder. The event names the stuck process and its top frames."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ClusterError
from verl_cluster.launch import ray_jobs
from verl_cluster.lifecycle.nodes import run_on_nodes
from verl_cluster.watch.clean import actor_pairs


@dataclass
class Bundle:
    folder: Optional[Path]
    summary: str
    stuck: str = ""  # "10.0.0.2 pid 77 (worker, stopped) ray::WorkerDict.update_actor"
    frames: list[str] = field(default_factory=list)  # the stuck process's top frames (py-spy)


def top_frames(stack: str, n: int = 6) -> list[str]:
    """One thread's first frames from a py-spy dump of one process (the innermost first, as py-spy prints them),
    headed by the thread's line: the first thread py-spy calls active, else the main thread, else the first one.
    Frames of different threads are never mixed (an idle GC thread's wait says nothing about the hang)."""
    lines = [x.rstrip() for x in stack.splitlines() if x.strip()]
    heads = [i for i, x in enumerate(lines) if x.startswith("Thread ")]
    if not heads:
        return lines[:n]
    pick = next((i for i in heads if "(active" in lines[i]), None)
    pick = pick if pick is not None else next((i for i in heads if '"MainThread"' in lines[i]), heads[0])
    end = next((i for i in heads if i > pick), len(lines))
    return [lines[pick].strip()] + [x.strip() for x in lines[pick + 1:end]][:n]


def _stuck(dumps: list[tuple[str, dict]]) -> tuple[str, list[str]]:
    """The process to name: one that is stopped (state T) or in uninterruptible sleep (D) first, then the driver."""
    order = sorted(dumps, key=lambda x: (x[1].get("state") != "T", not x[1].get("stack"), x[1].get("state") != "D",
                                         x[1]["role"] != "driver"))  # a shell that runs the driver has no stack
    if not order:
        return "", []
    ip, d = order[0]
    state = {"T": "stopped", "D": "in uninterruptible sleep"}.get(d.get("state"), d.get("state", "?"))
    return f"{ip} pid {d['pid']} ({d['role']}, {state}) {d['cmd'][:80]}", top_frames(d.get("stack", ""))


def collect(spec: ClusterSpec, api, sid: str, ray_job_id: str, folder: Path) -> Bundle:
    folder.mkdir(parents=True, exist_ok=True)
    why: list[str] = []
    actors: list[dict] = []
    try:  # first: the actors' pids find the workers that carry no RAY_JOB_ID of the job (pooled ones)
        if ray_job_id:
            actors = ray_jobs.state_list(api, "actors", (("job_id", ray_job_id),))
    except ClusterError as e:
        why.append(f"actor table: {e.message}")
    (folder / "actors.json").write_text(json.dumps(actors, indent=1, default=str) + "\n")
    pairs = actor_pairs(actors)

    def stacks_args(node) -> tuple[str, ...]:
        pyspy = os.path.join(os.path.dirname(node.spec.ray_executable(node.node)), "py-spy")
        return node.spec.temp_dir, sid, ray_job_id, pyspy, "24", pairs

    text, dumps = [], []
    for r in run_on_nodes(spec, "stacks", stacks_args, timeout=180):
        ip = r.host
        if not r.ok:
            why.append(f"{ip}: {r.reason}")
            continue
        if r.value["processes"] and not r.value["pyspy"]:
            why.append(f"{ip}: py-spy is not installed (pip install py-spy)")
        for d in r.value["dumps"]:
            text += [f"== {ip} pid {d['pid']} ({d['role']}, state {d.get('state', '?')}, "
                     f"{d.get('rss_mib', 0)} MiB RSS) {d['cmd']}", (d["stack"] or f"(no stack: {d['error']})").rstrip(),
                     ""]
            dumps.append((ip, d))
            if not d["stack"]:
                why.append(f"{ip} pid {d['pid']}: {d['error'] or 'py-spy printed nothing'}")
    (folder / "stacks.txt").write_text("\n".join(text) + "\n")
    logs = [r for r in run_on_nodes(spec, "joblogs", lambda n: (n.spec.temp_dir, ray_job_id, "40", pairs),
                                     timeout=60) if r.ok]
    (folder / "worker-logs.txt").write_text("\n".join(
        f"== {r.host} {x['file']}\n" + "\n".join(x["lines"]) for r in logs for x in r.value["logs"]) + "\n")
    gpus = [{"ip": r.host, **r.value} if r.ok else {"ip": r.host, "error": r.reason}
            for r in run_on_nodes(spec, "jobprocs", lambda n: (n.spec.temp_dir, ray_job_id, "0", pairs), timeout=60)]
    (folder / "nvml.json").write_text(json.dumps(gpus, indent=1) + "\n")
    stuck, frames = _stuck(dumps)
    n_stacks = sum(1 for _, d in dumps if d["stack"])
    summary = (f"{n_stacks} stack(s) of {len(dumps)} process(es), {len(actors)} actor(s), "
               f"{sum(len(r.value['logs']) for r in logs)} worker log(s), NVML of {len(gpus)} node(s) in {folder}")
    if why:
        summary += f"; {len(why)} not collected: {'; '.join(why)[:300]}"
    return Bundle(folder, summary, stuck, frames)
