"""The hang bundle: what verl's maintainers ask for in a hang report, collected from every node of the run in one
go before the hung attempt is stopped — py-spy stacks of the driver, every worker and vLLM's processes, Ray's actor
table for the job, the last lines of each worker's log, and NVML per GPU (who holds what) — into
bundle-<attempt>/ in the run folder. The event names the stuck process and its top frames."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.names import MASK, is_secret_name, mask_url_credentials
from verl_cluster.errors import ClusterError
from verl_cluster.jobs import ray_jobs
from verl_cluster.nodes.agent import run_on_nodes
from verl_cluster.watch.clean import actor_pairs
from verl_cluster.watch.private import private_dir, write_private

ENV_KEYS = ("env_vars", "env")  # a runtime_env's variables: names kept, values never written


def scrub(x: Any) -> Any:
    """State API detail as the bundle may keep it: every environment value (a runtime_env's `env_vars`, also inside
    the JSON strings Ray keeps it in, such as `serialized_runtime_env`) and secret-named field replaced by ***, a
    URL's credentials masked. The names stay: which variables a job had is what a hang report needs."""
    if isinstance(x, dict):
        return {k: ({n: MASK for n in v} if k in ENV_KEYS and isinstance(v, dict) else
                    MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "") else scrub(v))
                for k, v in x.items()}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    if isinstance(x, str):
        if x[:1] in "{[":
            try:
                return json.dumps(scrub(json.loads(x)), separators=(",", ":"))
            except ValueError:
                pass
        return mask_url_credentials(x)
    return x


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
    private_dir(folder)
    why: list[str] = []
    actors: list[dict] = []
    try:  # first: the actors' pids find the workers that carry no RAY_JOB_ID of the job (pooled ones)
        if ray_job_id:
            actors = [a for a in ray_jobs.state_list(api, "actors", (("job_id", ray_job_id),)) if isinstance(a, dict)]
    except ClusterError as e:
        why.append(f"actor table: {e.message}")
    write_private(folder / "actors.json", json.dumps(scrub(actors), indent=1, default=str) + "\n")
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
    write_private(folder / "stacks.txt", "\n".join(text) + "\n")
    logs = [r for r in run_on_nodes(spec, "joblogs", lambda n: (n.spec.temp_dir, ray_job_id, "40", pairs),
                                     timeout=60) if r.ok]
    write_private(folder / "worker-logs.txt", "\n".join(
        f"== {r.host} {x['file']}\n" + "\n".join(x["lines"]) for r in logs for x in r.value["logs"]) + "\n")
    gpus = [{"ip": r.host, **r.value} if r.ok else {"ip": r.host, "error": r.reason}
            for r in run_on_nodes(spec, "jobprocs", lambda n: (n.spec.temp_dir, ray_job_id, "0", pairs), timeout=60)]
    write_private(folder / "nvml.json", json.dumps(gpus, indent=1) + "\n")
    stuck, frames = _stuck(dumps)
    n_stacks = sum(1 for _, d in dumps if d["stack"])
    summary = (f"{n_stacks} stack(s) of {len(dumps)} process(es), {len(actors)} actor(s), "
               f"{sum(len(r.value['logs']) for r in logs)} worker log(s), NVML of {len(gpus)} node(s) in {folder}")
    if why:
        summary += f"; {len(why)} not collected: {'; '.join(why)[:300]}"
    return Bundle(folder, summary, stuck, frames)
