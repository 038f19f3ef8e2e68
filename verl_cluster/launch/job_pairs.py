"""For `jobs --json`: each planned job's predicted vs measured pairs (check_run.pairs), read from its log.

Only jobs whose metadata keeps the plan's predictions are read; their logs are fetched side by side, all within
one deadline; a log that cannot be read in time gives no pairs and the reason."""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from verl_cluster.launch import ray_jobs
from verl_cluster.launch.integrations import plan_predictions

PARALLEL = 8  # logs fetched at once: a dashboard serves them from the nodes' files


def pairs_of(text: str, predicted: dict[str, Any]) -> dict[str, Any]:
    """{"vs_plan": rows} for a log, with "vs_plan_reason" when there are none."""
    from verl_cluster.launch.verl_log import VerlProgress

    prog = VerlProgress(predicted=predicted)
    prog.feed(text)
    prog.flush()
    rows = prog.vs_plan()
    if rows:
        return {"vs_plan": rows}
    why = "no verl step in its log" if not prog.steps else "no verl step after the first in its log yet"
    return {"vs_plan": [], "vs_plan_reason": why}


def job_pairs(api: ray_jobs.JobsApi, rows: Sequence[ray_jobs.JobRow], timeout_s: float) -> dict[str, dict]:
    """submission id -> pairs_of(its log) for every row with predictions kept; a log not read within timeout_s,
    or refused, gives {"vs_plan": [], "vs_plan_reason": why}. Fetches run in daemon threads: one that hangs never
    keeps this process alive."""
    todo = [(r.submission_id, p) for r in rows if (p := plan_predictions(r.plan))]
    got: dict[str, dict] = {}
    gate = threading.Semaphore(PARALLEL)

    def read(sid: str, predicted: dict) -> None:
        with gate:
            try:
                got[sid] = pairs_of(ray_jobs.logs(api, sid), predicted)
            except Exception as e:  # noqa: BLE001 - one unreadable log is that job's reason, not the command's end
                why = getattr(e, "message", None) or f"{type(e).__name__}: {str(e)[:200]}"
                got[sid] = {"vs_plan": [], "vs_plan_reason": f"its log could not be read: {why}"}

    threads = [threading.Thread(target=read, args=t, name=f"logs-{t[0]}", daemon=True) for t in todo]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = {"vs_plan": [], "vs_plan_reason": f"its log was not read within {timeout_s:g}s (--timeout)"}
    return {sid: dict(got.get(sid) or late) for sid, _ in todo}


def with_pairs(rows: Sequence[ray_jobs.JobRow], pairs: dict[str, dict]) -> list[dict]:
    """The rows as `jobs --json` prints them, each planned job with its pairs."""
    return [r.__dict__ | pairs.get(r.submission_id, {}) for r in rows]
