"""`jobs`, `logs JOB [--follow]`, `stop JOB`: the cluster's Ray jobs. Without `-c`, the cluster is the one the
job was submitted to from this machine (its local record), else the default."""

from __future__ import annotations

import argparse
import sys
import time

from rich.markup import escape
from rich.table import Table

from verl_cluster.cli.cluster_args import DEFAULT_CLUSTER, add_cluster_args, resolve_cluster
from verl_cluster.cli.follow import follow_job
from verl_cluster.cli.output import err, out, print_json
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY
from verl_cluster.launch import job_records, ray_jobs

_DEFAULT = f"the job's cluster when it was submitted from here, else {DEFAULT_CLUSTER}"


def job_id_arg(p: argparse.ArgumentParser) -> None:
    a = p.add_argument("job_id", metavar="JOB", help="submission id (see `verl-cluster jobs`)")
    a.completer = lambda **_: job_records.recent_ids()  # read by argcomplete, when installed


def load_for_job(args, job_id: str | None = None):
    """The cluster spec for a job: -c/positional FILE, else the job's local record, else the default."""
    if resolve_cluster(args, default=None) is None:
        rec = job_records.lookup(job_id) if job_id else job_records.latest()
        args.cluster = rec["cluster_file"] if rec else DEFAULT_CLUSTER
        if rec and not job_id:
            err.print(f"[dim]cluster {escape(args.cluster)} (of the last job submitted from here; -c to choose)[/]")
    return load_cluster(args.cluster, args.overrides)


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("jobs", parents=[common], help="list the cluster's jobs")
    add_cluster_args(p, default=_DEFAULT)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_jobs)

    p = sub.add_parser("logs", parents=[common], help="a job's logs")
    job_id_arg(p)
    add_cluster_args(p, default=_DEFAULT)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")
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


def run_jobs(args) -> int:
    spec = load_for_job(args)
    with ray_jobs.connect(spec) as api:
        rows = ray_jobs.list_jobs(api)
    if args.json:
        print_json([r.__dict__ for r in rows])
        return EXIT_OK
    if not rows:
        err.print("no jobs on this cluster")
        return EXIT_OK
    t = Table(show_edge=False)
    for c in ("submission id", "status", "started", "duration", "watch", "entrypoint"):
        t.add_column(c)
    style = {"SUCCEEDED": "green", "FAILED": "red", "RUNNING": "cyan", "STOPPED": "yellow"}
    for r in rows:
        dur = f"{r.duration_s:.0f}s" if r.duration_s is not None else "-"
        t.add_row(r.submission_id, f"[{style.get(r.status, '')}]{r.status}[/]", _age(r.start_time), dur,
                  escape(_watch_note(spec.cluster_name, r)), escape(r.entrypoint[:80]))
    out.print(t)
    return EXIT_OK


def _watch_note(cluster: str, r) -> str:
    """`resumes X` for a resubmission; restarts and the last event for the first job of a watched run."""
    from verl_cluster.watch.runs import run_summary

    if r.previous:
        return f"resumes {r.previous}"
    return run_summary(cluster, r.submission_id)


def run_logs(args) -> int:
    spec = load_for_job(args, args.job_id)
    with ray_jobs.connect(spec) as api:
        if not args.follow:
            sys.stdout.write(ray_jobs.logs(api, args.job_id))
            sys.stdout.flush()
            return EXIT_OK
        from verl_cluster.launch.integrations import plan_predictions

        row = ray_jobs.job_info(api, args.job_id)
        return follow_job(api, args.job_id, False, f"verl-cluster logs {args.job_id} -c {args.cluster} --follow",
                          verl="verl." in row.entrypoint, predicted=plan_predictions(row.plan))


def run_stop(args) -> int:
    spec = load_for_job(args, args.job_id)
    with ray_jobs.connect(spec) as api:
        row = ray_jobs.stop(api, args.job_id)
    if args.json:
        print_json(row.__dict__)
    else:
        err.print(f"{row.submission_id}: {row.status}")
    return EXIT_OK if row.status in ray_jobs.TERMINAL else EXIT_UNHEALTHY
