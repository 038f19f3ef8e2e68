"""For `jobs --json`: each planned job's predicted vs measured pairs (check_run.pairs), read from its log.

Only jobs whose metadata keeps the plan's predictions are read; their logs are read side by side, by byte ranges,
parsed as they stream, all within one deadline. A job submitted from here keeps what was read in its record
(records/job_records.py): a finished job's pairs once and for all, a running one's parse state and offset, so the
next `jobs --json` reads only what the job wrote since. A log not read in time gives no pairs and the reason."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Sequence

from verl_cluster.records import job_records
from verl_cluster.jobs import ray_jobs
from verl_cluster.submit.integrations import plan_predictions

PARALLEL = 8  # logs read at once


def pairs_of(text: str, predicted: dict[str, Any]) -> dict[str, Any]:
    """{"vs_plan": rows} for a whole log, with "vs_plan_reason" when there are none."""
    from verl_cluster.verl_logs.verl_log import VerlProgress

    prog = VerlProgress(predicted=predicted)
    prog.feed(text)
    prog.flush()
    return progress_pairs(prog)


def progress_pairs(prog: Any) -> dict[str, Any]:
    fields = prog.vs_plan_fields()
    if fields.get("vs_plan"):
        return fields
    why = "no verl step in its log" if not prog.any_step else "no verl step after the first in its log yet"
    return {"vs_plan": [], "vs_plan_reason": why}


def read_pairs(api: ray_jobs.JobsApi, row: ray_jobs.JobRow, predicted: dict[str, Any], deadline: float) -> dict:
    """The pairs of one job: from its record when a finished job's were kept there; else its log read from where
    the record's state left off (or from the start), kept in the record when there is one."""
    from verl_cluster.verl_logs.job_log import AgentLog, LogFollower
    from verl_cluster.verl_logs.verl_log import KEEP_STEPS, VerlProgress

    rec = job_records.lookup(row.submission_id) or {}
    if isinstance(rec.get("vs_plan_final"), dict):
        return rec["vs_plan_final"]
    state = rec.get("vs_plan_log") if isinstance(rec.get("vs_plan_log"), dict) else {}
    try:
        prog = VerlProgress.from_json(state.get("progress") or {}, predicted, KEEP_STEPS)
        offset = int(state.get("offset") or 0)
    except (TypeError, ValueError, AttributeError):  # a record written by hand or cut short: read it afresh
        prog, offset = VerlProgress(predicted=predicted, keep_steps=KEEP_STEPS), 0
    f = LogFollower(AgentLog(api, row.submission_id), offset, [prog.feed])
    try:
        f.poll()
        while f.behind and time.monotonic() < deadline:
            f.poll()
    finally:
        f.source.close()
    final = not f.behind and row.status in ray_jobs.TERMINAL and f.size is not None
    if final:
        f.flush()
    got = progress_pairs(prog)
    if rec:
        keep = {"vs_plan_final": got} if final else {"vs_plan_log": {"offset": f.line_offset,
                                                                      "progress": prog.to_json()}}
        job_records.update(row.submission_id, **keep)
    if final:  # the machines' speed, for the next plan on them (as submit's follow keeps it), whoever submitted it
        from verl_cluster.records import host_speed

        host_speed.remember(row.submission_id, predicted, got.get("vs_plan_host"))
    if f.behind:
        raise TimeoutError
    return got


def job_pairs(api: ray_jobs.JobsApi, rows: Sequence[ray_jobs.JobRow], timeout_s: float) -> dict[str, dict]:
    """submission id -> its pairs for every row with predictions kept; a log not read within timeout_s, or
    refused, gives {"vs_plan": [], "vs_plan_reason": why}. Reads run in daemon threads: one that hangs never
    keeps this process alive."""
    todo = [(r, p) for r in rows if (p := plan_predictions(r.plan))]
    got: dict[str, dict] = {}
    gate = threading.Semaphore(PARALLEL)
    deadline = time.monotonic() + timeout_s

    def read(row: ray_jobs.JobRow, predicted: dict) -> None:
        with gate:
            try:
                got[row.submission_id] = read_pairs(api, row, predicted, deadline)
            except TimeoutError:
                pass  # said below, as for a read that never returned
            except Exception as e:  # noqa: BLE001 - one unreadable log is that job's reason, not the command's end
                why = getattr(e, "message", None) or f"{type(e).__name__}: {str(e)[:200]}"
                got[row.submission_id] = {"vs_plan": [], "vs_plan_reason": f"its log could not be read: {why}"}

    threads = [threading.Thread(target=read, args=t, name=f"logs-{t[0].submission_id}", daemon=True) for t in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = {"vs_plan": [], "vs_plan_reason": f"its log was not read within {timeout_s:g}s (--timeout)"}
    return {r.submission_id: dict(got.get(r.submission_id) or late) for r, _ in todo}


def job_json(row: ray_jobs.JobRow) -> dict[str, Any]:
    """A job as every --json prints it (docs/cli.md): its row, the plan kept in its metadata as an object (null
    when none was kept, or what was kept is not ours to read), not the JSON text Ray stores."""
    try:
        plan = json.loads(row.plan) if row.plan else None
    except ValueError:
        plan = None
    return row.__dict__ | {"plan": plan if isinstance(plan, dict) else None}


def with_pairs(rows: Sequence[ray_jobs.JobRow], pairs: dict[str, dict]) -> list[dict]:
    """The rows as `jobs --json` prints them, each planned job with its pairs."""
    return [job_json(r) | pairs.get(r.submission_id, {}) for r in rows]
