"""The host speed earlier runs showed on a set of machines: ~/.verl-cluster/host_speed.json.

When a planned verl run's steps are in (`submit`'s follow and `watch` at a run's end or detach, `jobs --json` once a
run has ended), the factor on the plan's host terms that explained it (check_run.host_fit, `vs_plan_host`) is kept
here under the machines it ran on (placement/learned_host.machines_key: the nodes' hostnames and GPU UUIDs). The
next plan for the same machines starts from it (placement.host_factor: auto). One GPU kind ran one verl line up to
1.75x apart on different machines, while a run planned from its machine's other runs came within 13% on four of
five held-out runs (docs/placement.md, "The host speed a cluster's runs showed").
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional

from verl_cluster.config.state_files import finite_time, read_state_json
from verl_cluster.placement.factors import HOST_FACTOR_RANGE

STORE = "~/.verl-cluster/host_speed.json"
KEEP = 200  # entries kept, newest first: a few per set of machines is all a plan reads
MAX_BYTES = 2**20


def store_path() -> Path:
    return Path(os.path.expanduser(STORE))


def _valid(e: Any) -> bool:
    if not isinstance(e, dict) or not isinstance(e.get("machines"), str) or not isinstance(e.get("submission_id"), str):
        return False
    f, (lo, hi) = e.get("factor"), HOST_FACTOR_RANGE  # the factors check_run.host_fit can find
    return (isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and lo <= f <= hi
            and finite_time(e.get("recorded_at")) > 0)


def entries() -> list[dict[str, Any]]:
    """Every entry kept, newest first (a damaged or foreign file counts as none)."""
    doc = read_state_json(store_path(), MAX_BYTES)
    got = doc.get("runs") if isinstance(doc, dict) else None
    return sorted((e for e in got or () if _valid(e)), key=lambda e: -finite_time(e["recorded_at"]))


def record(machines: str, submission_id: str, factor: float, *, job: str = "", cluster: str = "",
           step_error_at_factor: Optional[float] = None, now: Optional[float] = None) -> bool:
    """Keep one run's host factor; a run recorded again replaces its entry and keeps its first time (`jobs --json`
    reads an ended run of another machine's each time). Best effort: a read-only home costs the next plan this
    figure only."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return False
    entry = {"machines": machines, "submission_id": submission_id, "factor": round(float(factor), 4), "job": job,
             "cluster": cluster, "recorded_at": time.time() if now is None else now}
    if step_error_at_factor is not None:
        entry["step_error_at_factor"] = step_error_at_factor
    if not _valid(entry):
        return False
    path = store_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:  # two runs ending at once (two shells following, `watch` beside `jobs --json`) both stay
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = entries()
        entry["recorded_at"] = next((e["recorded_at"] for e in kept if e["submission_id"] == submission_id),
                                    entry["recorded_at"])
        runs = sorted([entry] + [e for e in kept if e["submission_id"] != submission_id],
                      key=lambda e: -finite_time(e["recorded_at"]))
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"runs": runs[:KEEP]}, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        return False
    finally:
        os.close(lock)  # and its lock with it
    return True


def for_machines(machines: str, limit: int) -> list[dict[str, Any]]:
    """The newest LIMIT runs kept for these machines."""
    return [e for e in entries() if e["machines"] == machines][:limit]


def remember(submission_id: str, predicted: Optional[dict[str, Any]], host: Optional[dict[str, Any]]) -> bool:
    """Keep a run's host fit (`vs_plan_host`) when it explained the run and its plan named its machines."""
    machines = (predicted or {}).get("machines")
    if not (isinstance(machines, str) and machines and host and host.get("explains")):
        return False
    from verl_cluster.records import job_records

    rec = job_records.lookup(submission_id) or {}
    return record(machines, submission_id, host.get("factor"), job=str(rec.get("job") or ""),
                  cluster=str(rec.get("cluster") or ""), step_error_at_factor=host.get("step_error_at_factor"))


def remember_run(submission_id: str, progress: Any) -> bool:
    """After following a run (verl_log.VerlProgress): its host fit, as `remember` keeps it."""
    if progress is None or not getattr(progress, "predicted", None):
        return False
    _, host = progress.vs_plan_both()
    return remember(submission_id, progress.predicted, host)
