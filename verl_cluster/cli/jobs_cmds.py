"""`jobs`, `logs JOB [--follow]`, `stop JOB`: the clusters' Ray jobs. Without `-c`, `logs`/`stop` use the cluster the
job was submitted to from this machine (its local record), else the default; `jobs` lists every cluster this
machine brought up or submitted to, asked in parallel, and names the ones that do not answer."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from rich.markup import escape
from rich.table import Table

from verl_cluster.cli.cluster_args import Chosen, add_cluster_args, resolve_cluster, say_cluster
from verl_cluster.cli.follow import follow_job
from verl_cluster.cli.output import err, one_line, out, print_json
from verl_cluster.launchers import load_cluster
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY, ConfigError
from verl_cluster.job_list import all_jobs
from verl_cluster.jobs import ray_jobs
from verl_cluster.verl_logs import job_log
from verl_cluster.records import job_records

_DEFAULT = "the job's cluster when it was submitted from here, else as every command chooses (see `up --help`)"
_EVERY = "$VERL_CLUSTER, else every cluster brought up or submitted to from here, else this machine"
_JOBS_HELP = """\
Without -c: the jobs of every cluster this machine ran `up` on or submitted to (records under
~/.verl-cluster), all asked at once, each within --timeout; a cluster that does not answer (its
allocation ended, its head is off) gets one line saying why, and the others are still listed.
A cluster taken down with `down` from here is not asked (one line says it is down) until `up`
or `submit` uses it again.
--json: {"clusters": [...]}, with -c as without (one cluster then), each with its "jobs" or, when
it did not answer, its "error" and "hint", or when down, "down": true. A job's "plan" is what
its plan assumed and predicted (an object; null when it was submitted without one).
A job submitted with a placement plan also gets "vs_plan": the plan's predictions against what
verl logged (seconds per phase and step at the run's own lengths, the checkpoint save, host RAM;
rows of what, predicted, measured, error), read from its log within --timeout; with no rows
(no step after the first yet, or a log not read in time) "vs_plan_reason" says why; "vs_plan_host"
the factor on the plan's host terms closest to the run and whether it explains a miss. A job
submitted from here keeps them in its record (~/.verl-cluster/jobs): once it has ended its log
is not read again; while it runs, only what it wrote since the last `jobs --json` is read.
scripts/plan_factors.py turns a set of them into factors for `plan --factors`; an ended run's
vs_plan_host that explained it is kept for the next plan on its machines (placement.host_factor).
The table does not read logs.

exit status: without -c, 0 once every recorded cluster has been reported (its jobs, that it is
down, or one line saying why it did not answer): clusters long gone never make `jobs` fail
(drop one with `verl-cluster forget NAME`); with -c NAME/FILE (or $VERL_CLUSTER), 0 when that
cluster answered, 1 when it did not; 2 for bad input: a bad --timeout, or with -c an unreadable
file, an unknown name or a misspelt override (without -c, a recorded cluster whose file is gone
or wrong is one that did not answer)."""


def job_id_arg(p: argparse.ArgumentParser) -> None:
    a = p.add_argument("job_id", metavar="JOB", help="submission id (see `verl-cluster jobs`)")
    a.completer = lambda **_: job_records.recent_ids()  # read by argcomplete, when installed


def load_for_job(args, job_id: str):
    """The cluster spec for a job: -c/positional (a file or a recorded name), else the job's local record, else
    the cluster every command would use (cli/cluster_args.py). An id not recorded here but nearly one that is (a
    character short) is a typo: named with the recorded one, not sent to a cluster for a bare 404."""
    if job_records.lookup(job_id) is None:
        import difflib

        near = difflib.get_close_matches(job_id, job_records.recent_ids(), n=1, cutoff=0.9)
        if near:
            raise ConfigError(f"no job `{job_id}` was submitted from here", f"did you mean `{near[0]}`? "
                              "(`verl-cluster jobs` lists them)")
    if resolve_cluster(args, fallback=False, use_env=False) is None:
        rec = job_records.lookup(job_id)
        if rec:
            args.cluster, args.chosen = rec["cluster_file"], Chosen(rec["cluster_file"], how=f"{job_id}'s record")
        else:
            resolve_cluster(args)
    spec = load_cluster(args.cluster, args.overrides)
    say_cluster(spec.cluster_name, args.chosen)
    return spec


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("jobs", parents=[common], help="list the jobs of a cluster, or of every one known here",
                       description="List Ray jobs.", epilog=_JOBS_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_args(p, default=_EVERY)
    p.add_argument("--timeout", type=float, default=all_jobs.ANSWER_TIMEOUT_S, metavar="SECONDS",
                   help="without -c: how long each cluster may take to answer; with --json, the planned jobs' logs "
                        "are read within it too (default %(default)g)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_jobs)

    p = sub.add_parser("logs", parents=[common], help="a job's logs")
    job_id_arg(p)
    add_cluster_args(p, default=_DEFAULT)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")
    p.add_argument("-n", "--tail", type=int, metavar="N",
                   help="only the last N lines (with --follow: start there); the log is never read whole")
    p.set_defaults(func=run_logs)

    p = sub.add_parser("stop", parents=[common], help="stop a job")
    job_id_arg(p)
    add_cluster_args(p, default=_DEFAULT)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_stop)


def _age(ms) -> str:
    if not ms:
        return "-"
    s = time.time() - ms / 1000
    return f"{s:.0f}s ago" if s < 120 else (f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago")


def _check_timeout(args) -> None:
    if not 0 < args.timeout <= 3600:  # nan and inf too
        raise ConfigError(f"--timeout {args.timeout:g}: must be more than 0 and at most 3600 seconds",
                          "e.g. --timeout 20")


def run_jobs(args) -> int:
    _check_timeout(args)  # bad input whether or not this form reads it
    if resolve_cluster(args, fallback=False) is None:  # neither -c nor $VERL_CLUSTER
        known = job_records.known_clusters()
        if known:
            return _jobs_everywhere(args, known)
        resolve_cluster(args)
    spec = load_cluster(args.cluster, args.overrides)
    say_cluster(spec.cluster_name, args.chosen)
    with ray_jobs.connect(spec) as api:
        rows = ray_jobs.list_jobs(api)
        if args.json:  # the logs of the planned jobs only, and only here: the table stays one request
            from verl_cluster.job_list.job_pairs import job_pairs

            one = all_jobs.ClusterJobs(spec.cluster_name, os.path.abspath(args.cluster), rows,
                                       pairs=job_pairs(api, rows, args.timeout))
            print_json({"clusters": [one.to_json()]})  # the shape without -c: one for scripts to read
            return EXIT_OK
    if not rows:
        err.print("no jobs on this cluster")
        return EXIT_OK
    out.print(_table(spec.cluster_name, rows))
    return EXIT_OK


def _jobs_everywhere(args, known) -> int:
    found = all_jobs.jobs_everywhere(known, load_cluster, args.overrides, timeout_s=args.timeout, pairs=args.json)
    answered = [c for c in found if c.answered]
    if args.json:
        print_json({"clusters": [c.to_json() for c in found]})
    else:
        for c in answered:
            where = f"[bold]{escape(c.cluster)}[/] [dim]{escape(c.cluster_file)}[/]"
            if c.rows:
                out.print(where)
                out.print(_table(c.cluster, c.rows))
            else:
                out.print(f"{where}: no jobs")
        for c in found:
            if c.down:  # what the user did, not a failure: said once, quietly, with the way back
                back = shlex.join(["verl-cluster", "up", "-c", c.cluster_file, *c.overrides])
                err.print(f"[dim]{escape(c.cluster)} ({escape(c.cluster_file)}) is down: taken down from here "
                          f"{_age(c.down_at * 1000)}  hint: bring it back with `{escape(back)}`[/]", soft_wrap=True)
            elif not c.answered:  # one line each, however wide: a script may count them
                hint = f"  [dim]hint: {escape(one_line(c.hint))}[/]" if c.hint else ""
                hint += f"  [dim](gone for good? verl-cluster forget {escape(c.cluster)})[/]"
                err.print(f"[yellow]{escape(c.cluster)}[/] ({escape(c.cluster_file)}) did not answer: "
                          f"{escape(one_line(c.error))}{hint}", soft_wrap=True)
    return EXIT_OK  # every recorded cluster reported: one that did not answer is a line, not a failure


def _table(cluster: str, rows) -> Table:
    t = Table(show_edge=False)
    for c in ("submission id", "status", "started", "duration", "watch", "entrypoint"):
        t.add_column(c)
    style = {"SUCCEEDED": "green", "FAILED": "red", "RUNNING": "cyan", "STOPPED": "yellow"}
    for r in rows:
        dur = f"{r.duration_s:.0f}s" if r.duration_s is not None else "-"
        t.add_row(r.submission_id, f"[{style.get(r.status, '')}]{r.status}[/]", _age(r.start_time), dur,
                  escape(_watch_note(cluster, r)), escape(r.entrypoint[:80]))
    return t


def _watch_note(cluster: str, r) -> str:
    """`resumes X` for a resubmission; restarts and the last event for the first job of a watched run."""
    from verl_cluster.watch.runs import run_summary

    if r.previous:
        return f"resumes {r.previous}"
    return run_summary(cluster, r.submission_id)


def run_logs(args) -> int:
    if args.tail is not None and not 0 <= args.tail <= 10_000_000:
        raise ConfigError(f"--tail {args.tail}: must be a number of lines from 0 to 10000000", "e.g. --tail 200")
    spec = load_for_job(args, args.job_id)
    with ray_jobs.connect(spec) as api:
        if not args.follow:
            if not job_log.print_log(api, args.job_id, sys.stdout, args.tail):
                err.print(f"no log of {escape(args.job_id)} on its driver's node: its driver has not started yet, or "
                          "Ray was restarted since it ran (see `verl-cluster jobs`)")
            return EXIT_OK
        from verl_cluster.submit.integrations import plan_predictions

        row = ray_jobs.job_info(api, args.job_id)
        offset = job_log.tail_offset(api, args.job_id, args.tail) if args.tail is not None else 0
        return follow_job(api, args.job_id, False, f"verl-cluster logs {args.job_id} -c {args.cluster} --follow",
                          verl="verl." in row.entrypoint, predicted=plan_predictions(row.plan), offset=offset)


def run_stop(args) -> int:
    spec = load_for_job(args, args.job_id)
    with ray_jobs.connect(spec) as api:
        row = ray_jobs.stop(api, args.job_id)
    if args.json:
        from verl_cluster.job_list.job_pairs import job_json

        print_json(job_json(row))
    else:
        err.print(f"{row.submission_id}: {row.status}")
    return EXIT_OK if row.status in ray_jobs.TERMINAL else EXIT_UNHEALTHY
