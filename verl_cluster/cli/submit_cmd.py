"""`submit JOB.yaml [key=value ...]`: preflight, then a Ray job (or torchrun), following its logs."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from rich.markup import escape

from verl_cluster.cli.follow import follow_job
from verl_cluster.cli.plan_cmd import add_model_config, model_config_word
from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNHEALTHY
from verl_cluster.records import job_records
from verl_cluster.jobs import ray_jobs
from verl_cluster.submit.preflight import PreflightReport
from verl_cluster.submit.job_input import JobInput, working_dir_word
from verl_cluster.submit.pipeline import (Submission, check_cluster_file, plan_submission, preflight_exit_code,
                                        warm_imports)

LEVEL_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green", "skipped": "dim"}


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("submit", parents=[common], help="preflight, then run a job (Ray Jobs or torchrun)",
                       description="Check a job before any GPU time, then run it on the cluster and follow its logs.")
    p.add_argument("job", nargs="?", help="job spec (launch/gsm8k.yaml), a verl script (run_qwen2-7b_grpo.sh), or, after --, "
                               "the command itself: -- python3 -m verl.trainer.main_ppo key=value ...")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="verl overrides (data.train_batch_size=256) or job fields (placement.strategy=split); "
                        "they win over the file's and the planner's")
    p.add_argument("-c", "--cluster", metavar="CLUSTER",
                   help="cluster file or recorded name (default: the job's `cluster:`, else as every command: "
                        "$VERL_CLUSTER, the one cluster up here, this machine)")
    p.add_argument("--slurm", action="store_true", help="the cluster `up --slurm` made in this Slurm allocation")
    p.add_argument("--working-dir", metavar="DIR",
                   help="ship DIR with the job to every node (as `ray job submit --working-dir`; job field "
                        "working_dir): the command runs inside it, so `-- python -m my_module` finds DIR/my_module.py")
    p.add_argument("--launcher", choices=("auto", "ray", "torchrun"), help="override the job's launcher")
    p.add_argument("--dry-run", action="store_true", help="print the full request after preflight, run nothing")
    p.add_argument("--no-follow", action="store_true", help="submit and return once the job is running")
    p.add_argument("--stop-on-interrupt", action="store_true", help="Ctrl-C stops the job instead of detaching")
    p.add_argument("--skip-preflight", action="store_true", help="submit without the checks (not recommended)")
    p.add_argument("--refresh-backend", action="store_true",
                   help="re-detect the network backend env (otherwise remembered for an hour per cluster)")
    p.add_argument("--watch", action="store_true",
                   help="keep the run up: heal, resume from its checkpoint, report (job's `watch:` settings)")
    p.add_argument("--detach", action="store_true", help="with --watch: the watcher runs in the background")
    gc_mode = p.add_mutually_exclusive_group()
    gc_mode.add_argument("--gc-freeze", action="store_true",
                         help="each Ray worker freezes what survives Python's slow full collections (python_gc: "
                              "freeze; the default unless the job sets its own worker_process_setup_hook)")
    gc_mode.add_argument("--no-gc-freeze", action="store_true",
                         help="leave Python's collector as it is in every worker (python_gc: default)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    add_model_config(p)
    p.set_defaults(func=run_submit)


def print_preflight(report: PreflightReport) -> None:
    for f in report.findings:
        style = LEVEL_STYLE.get(f.level, "")
        where = f" [dim]({escape(f.where)})[/]" if getattr(f, "where", None) else ""
        err.print(f"[{style}]{f.level:>7}[/] {f.check:<11} {escape(f.message)}{where}")
        if f.hint and f.level in ("error", "warning"):
            err.print(f"{'':>7} {'':<11} [yellow]hint:[/] {escape(f.hint)}")


def preflight_progress(enabled: bool):
    """A transient line on stderr while preflight runs (a terminal only; it prints nothing else)."""
    if not enabled:
        return contextlib.nullcontext()
    return err.status("preflight: probing the nodes, planning the placement, checking verl's config ...",
                      spinner="dots")


def job_input_of(args) -> JobInput:
    """The job as typed: the key=value words before `--` and the flags that set job fields are kept in its record."""
    before = list(getattr(args, "before", None) or []) + model_config_word(args) + working_dir_word(args.working_dir)
    before += ["python_gc=freeze"] if getattr(args, "gc_freeze", False) else []
    before += ["python_gc=default"] if getattr(args, "no_gc_freeze", False) else []
    return JobInput.from_words(args.job, list(args.overrides or []), before)


def run_submit(args) -> int:
    args.job_input = job_input_of(args)
    job, imported = args.job_input.load()
    if args.watch:
        from verl_cluster.watch.settings import check_watchable

        check_watchable(job)  # bad watch settings stop here, before anything is submitted
    if not args.dry_run:
        warm_imports()
    if args.slurm and not args.cluster:
        from verl_cluster.slurm.spec import cluster_file as slurm_cluster_file

        args.cluster = slurm_cluster_file()
    from verl_cluster.cli.cluster_args import cluster_for_job, say_cluster
    from verl_cluster.launchers import load_cluster

    chosen = cluster_for_job(job, args.cluster)
    cluster_file = chosen.file
    check_cluster_file(cluster_file)
    spec = load_cluster(cluster_file, list(chosen.overrides))  # a recorded name brings its `up` overrides
    say_cluster(spec.cluster_name, chosen)
    from verl_cluster.launchers import check_job_fits

    check_job_fits(job, cluster_file)  # inside an allocation: enough nodes, GPUs requested
    # secrets a script sets itself reach the job's env as the shell's would (never printed)
    environ = {**os.environ, **imported.secret_values} if imported else None
    with preflight_progress(enabled=not args.json and err.is_terminal):  # probes, the plan, verl's config: seconds
        sub = plan_submission(job, cluster_file, launcher=args.launcher, run_checks=not args.skip_preflight,
                              refresh_backend=args.refresh_backend, environ=environ, spec=spec)
    if args.watch and sub.job_launcher.detached and not args.skip_preflight:
        from verl_cluster.watch.shared_dir import check_shared_dir

        sub.preflight.findings.extend(check_shared_dir(sub.spec, str(job.get("trainer.default_local_dir"))))
    if not args.json:
        print_preflight(sub.preflight)
        for n in sub.not_applied:
            err.print(f"[dim]{'plan':>7} {'not applied':<11} {escape(n.line())}[/]")
    if args.dry_run:
        if args.json:
            print_json(sub.describe())
        else:
            _print_request(sub)
        return EXIT_OK if sub.preflight.ok else preflight_exit_code(sub.preflight)
    if not sub.preflight.ok:
        if args.json:
            print_json({"submitted": False, **sub.describe()})
        n = len(sub.preflight.errors)
        err.print(f"[bold red]error:[/] preflight found {n} problem{'s' if n > 1 else ''}: nothing was submitted")
        return preflight_exit_code(sub.preflight)
    if args.watch:
        sub.job_launcher.check_watchable()
    return _apply_ray(sub, args) if sub.job_launcher.detached else _apply_torchrun(sub, args)


def _print_request(sub: Submission) -> None:
    d = sub.request.describe()
    out.print(f"[bold]job[/] {escape(sub.job.name)}  [bold]launcher[/] {sub.launcher}  [bold]cluster[/] {escape(sub.cluster_file)}")
    if sub.job_launcher.detached:
        out.print(f"[bold]submission id[/] {d['submission_id']}")
        out.print(f"[bold]entrypoint[/] {escape(d['entrypoint'])}")
        for k, v in d["runtime_env"].items():
            if k != "env_vars":
                out.print(f"[bold]runtime_env.{k}[/] {escape(str(v))}")
        out.print("[bold]env[/]" + ("" if d["runtime_env"]["env_vars"] else " (none)"))
        for k, v in d["runtime_env"]["env_vars"].items():
            out.print(f"  {k}={escape(str(v))}")
        out.print(f"[bold]metadata[/] {escape(str(d['metadata']))}")
    else:
        out.print(f"[bold]run id[/] {d['run_id']}  [bold]master[/] {d['master']}  [bold]nproc/node[/] {d['nproc_per_node']}")
        for n in d["nodes"]:
            out.print(f"[bold]rank {n['rank']}[/] {escape(n['host'])}: {escape(n['command'])}")
            for k, v in n["env"].items():
                out.print(f"  {k}={escape(str(v))}")
    for note in sub.notes:
        out.print(f"[dim]note: {escape(note)}[/]")
    out.print("(dry run: nothing was submitted)")


def _apply_ray(sub: Submission, args) -> int:
    req = sub.request
    reattach = f"verl-cluster logs {req.submission_id} -c {sub.cluster_file} --follow"
    with ray_jobs.connect(sub.spec) as api:
        sid = sub.job_launcher.submit(api, req)
        from verl_cluster.watch.runs import submit_dir

        job_records.record(sid, sub.cluster_file, sub.spec.cluster_name, sub.job.name,
                           job_input=args.job_input.to_json(), submit_dir=submit_dir())  # for a later `watch`
        if args.watch:
            from verl_cluster.cli.watch_cmd import watch_submitted

            return watch_submitted(sub, sid, args)
        if args.no_follow:
            status = ray_jobs.wait_running(api, sid)
            if args.json:
                print_json({"submitted": True, "submission_id": sid, "status": status, "launcher": "ray"})
            else:
                err.print(f"submitted [bold]{sid}[/] ({status}); follow it: {escape(reattach)}")
            return EXIT_UNHEALTHY if status in ("FAILED", "STOPPED") else EXIT_OK
        err.print(f"submitted [bold]{sid}[/] to {escape(api.where)}; Ctrl-C detaches "
                  f"({'stops the job' if args.stop_on_interrupt else 'the job keeps running'})")
        from verl_cluster.submit.integrations import plan_predictions

        rc = follow_job(api, sid, args.stop_on_interrupt, reattach, args.json, verl=sub.job.runs_verl,
                        predicted=plan_predictions(req.metadata.get("verl_cluster.plan")))
        from verl_cluster.submit.hygiene import resume_hint

        hint = resume_hint(args.job_input, sub.cluster_file, req.argv)
        if hint and rc != 130:  # 130: detached, the run goes on
            err.print(escape(hint))
        return rc


def _apply_torchrun(sub: Submission, args) -> int:
    req = sub.request
    err.print(f"torchrun {req.run_id}: {len(req.nodes)} node(s) x {req.nproc_per_node} proc(s), "
              f"master {req.master_addr}:{req.master_port}; streaming rank 0")
    res = sub.job_launcher.run(sub.spec, req, out=sys.stderr if args.json else sys.stdout)
    if args.json:
        print_json({"run_id": req.run_id, "launcher": "torchrun", **res.to_json()})
    if res.ok:
        err.print(f"[green]torchrun {req.run_id}: every node exited 0[/]")
        return EXIT_OK
    err.print(f"[bold red]torchrun {req.run_id} failed[/]" + (" (interrupted)" if res.interrupted else ""))
    for n in res.nodes:
        err.print(f"  rank {n.rank} {escape(n.host)}: {n.state}, exit code {n.rc if n.rc is not None else '-'}")
        for line in list(n.tail)[-8:]:
            err.print(f"      {escape(line)}")
    return EXIT_UNHEALTHY if not res.interrupted else 130


__all__ = ["add_parsers", "run_submit", "EXIT_BAD_INPUT"]
