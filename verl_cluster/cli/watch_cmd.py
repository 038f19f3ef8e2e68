"""`watch JOB` (and `submit --watch`): keep a run up until it succeeds, is stopped, or its restart budget is spent.
`--detach` runs the watcher in the background with its own log; `watch JOB` again re-attaches (one per run)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from rich.markup import escape

from verl_cluster.cli.output import err, print_json
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY
from verl_cluster.terminal_text import for_terminal
from verl_cluster.watch.private import append_private
from verl_cluster.watch.runs import FINAL, RunLock, RunState, find_run, new_run, submit_dir


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    from verl_cluster.cli.jobs_cmds import job_id_arg

    p = sub.add_parser("watch", parents=[common], help="keep a submitted run up: detect, heal, resume, report",
                       description="Watch a job submitted from here (any submission id of its run): restart dead "
                                   "nodes, resume from the newest checkpoint, report every event.")
    job_id_arg(p)
    p.add_argument("-c", "--cluster", help="ignored when the run is known here (its cluster file is on record)")
    p.add_argument("--detach", action="store_true", help="run the watcher in the background (log in the run folder)")
    p.add_argument("--json", action="store_true", help="events as JSON lines on stdout, then a summary")
    p.set_defaults(func=run_watch)


def run_watch(args) -> int:
    st = find_run(args.job_id)
    if st.state in FINAL:
        return _summary(st, args.json, note=f"run {st.run} already ended: {st.state}")
    return _detach(st, args.json) if args.detach else watch_foreground(st, args.json)


def watch_submitted(sub, sid: str, args) -> int:
    """`submit --watch`: the submission just made becomes the first attempt of a run."""
    st = new_run(sid, sub.spec.cluster_name, sub.cluster_file, args.job_input, submit_dir())
    err.print(f"submitted [bold]{sid}[/]; watching it (run folder {escape(str(st.dir))})")
    return _detach(st, args.json) if args.detach else watch_foreground(st, args.json)


def watch_foreground(st: RunState, as_json: bool) -> int:
    from verl_cluster.launchers import load_cluster
    from verl_cluster.watch.events import Reporter
    from verl_cluster.watch.settings import settings_for
    from verl_cluster.watch.watcher import Watcher

    lock = RunLock(st).acquire()
    try:
        job = st.job_input().job()
        settings = settings_for(job)
        spec = load_cluster(st.cluster_file)
        # events quote the job's log lines (evidence, the tail): made safe for the terminal they are printed on
        reporter = Reporter(st.dir / "events.jsonl", settings.notify, as_json=as_json,
                            say=lambda text: err.print(escape(for_terminal(text))))
        w = Watcher(st, spec, job, settings, reporter, stream=None if as_json else sys.stdout)
        try:
            rc = w.run()
        except KeyboardInterrupt:
            err.print(f"watcher stopped; the job keeps running. Re-attach: verl-cluster watch {st.run}")
            return 130
    finally:
        lock.release()
    _summary(st, as_json)
    return rc


def _summary(st: RunState, as_json: bool, note: str = "") -> int:
    rc = EXIT_OK if st.state == "succeeded" else EXIT_UNHEALTHY
    if as_json:
        print_json({"run": st.run, "state": st.state, "restarts": st.restarts, "attempts": st.attempts,
                    "events": str(st.dir / "events.jsonl")})
        return rc
    if note:
        err.print(note)
    err.print(f"run {st.run}: {st.state}, {st.restarts} restart(s)")
    for a in st.attempts:
        cause = f" ({a['class']}: {escape(for_terminal(str(a.get('evidence', ''))[:120]))})" if a.get("class") else ""
        err.print(f"  {a['submission_id']}: {a.get('status', '?')}{_steps(a)}{cause}")
    last = (st.attempts[-1].get("class") == "user-code") and st.state == "failed"
    if last:
        err.print(f"last lines: verl-cluster logs {st.current}")
    return rc


def _steps(a: dict) -> str:
    """', resumed from step 2, steps 3..4, 1 step lost' for one attempt (what its log said)."""
    parts = []
    if a.get("resumed_from"):
        parts.append(f"resumed from step {a['resumed_from']}")
    if a.get("first_step") is not None:
        parts.append(f"steps {a['first_step']}..{a.get('last_step')}")
    if a.get("steps_lost"):
        parts.append(f"{a['steps_lost']} step(s) lost")
    return "".join(", " + p for p in parts)


def _detach(st: RunState, as_json: bool) -> int:
    lock = RunLock(st)
    if lock.is_held():
        lock.acquire()  # raises the clear "already watched" error
    log = st.dir / "watcher.log"
    with append_private(log) as fh:
        p = subprocess.Popen([sys.executable, "-m", "verl_cluster", "watch", st.run, "-c", st.cluster_file],
                             stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, "COLUMNS": "200"})
    time.sleep(1.0)
    if p.poll() is not None:
        err.print(f"[bold red]error:[/] the watcher exited at once ({p.returncode}); its log: {escape(str(log))}")
        return EXIT_UNHEALTHY
    if as_json:
        print_json({"run": st.run, "pid": p.pid, "log": str(log), "events": str(st.dir / "events.jsonl")})
    else:
        err.print(f"watcher for run {st.run} runs in the background (pid {p.pid}); log {escape(str(log))}; "
                  f"events {escape(str(st.dir / 'events.jsonl'))}; attach: verl-cluster watch {st.run}")
    return EXIT_OK
