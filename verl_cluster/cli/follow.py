"""Following a Ray job's logs to its end (`submit`, `logs --follow`): verl's progress, the failure's cause, the exit code."""

from __future__ import annotations

import sys

from rich.markup import escape

from verl_cluster.cli.output import err, print_json
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY
from verl_cluster.verl_logs import job_log
from verl_cluster.jobs import ray_jobs
from verl_cluster.terminal_text import for_terminal


def follow_job(api, sid: str, stop_on_interrupt: bool, reattach: str, as_json: bool = False,
               verl: bool = False, predicted=None, offset: int = 0) -> int:
    """`predicted`: the plan's predictions (kept in the job's metadata), held against what verl logs; `offset`:
    the byte of the log to start printing at."""
    from verl_cluster.verl_logs.verl_log import KEEP_STEPS, VerlProgress, describe

    progress = VerlProgress(predicted=predicted, keep_steps=KEEP_STEPS) if verl else None
    try:
        res = job_log.follow(api, sid, out=sys.stderr if as_json else sys.stdout, progress=progress, offset=offset)
    except KeyboardInterrupt:
        if stop_on_interrupt:
            row = ray_jobs.stop(api, sid)
            err.print(f"stopped {sid}: {row.status}")
            return EXIT_UNHEALTHY
        err.print(f"detached; {sid} keeps running. Re-attach: {escape(reattach)}")
        return 130
    if as_json:
        doc = {"submission_id": sid, "status": res.status, "message": res.message, "last_lines": res.tail}
        if res.verl is not None:
            doc["verl"] = res.verl
        if res.failure is not None:
            doc["failure"] = res.failure
        print_json(doc)
    for line in describe(res.verl or {}):
        err.print(_safe(line))
    if res.status == "SUCCEEDED":
        err.print(f"[green]{sid} SUCCEEDED[/]")
        return EXIT_OK
    err.print(f"[bold red]{sid} {res.status}[/]" + (f": {_safe(res.message)}" if res.message else ""))
    if res.failure:
        f = res.failure
        err.print(f"[bold red]cause ({f['class']}):[/] {escape(f['what'])}: {_safe(f['evidence'])}")
        err.print(f"[yellow]hint:[/] {escape(f['fix'])}")
    if res.tail and not as_json:
        err.print("last lines:")
        for line in res.tail:
            err.print("  " + _safe(line))
    return EXIT_UNHEALTHY


def _safe(text: str) -> str:
    """A line of the job's output (or its status message, which quotes it) as rich prints it to a person."""
    return escape(for_terminal(text))
