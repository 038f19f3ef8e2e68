"""`sbatch JOB.yaml`: write (and with --submit, submit) a Slurm batch script running the job end to end."""

from __future__ import annotations

import argparse
from pathlib import Path

from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_OK, ConfigError


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("sbatch", parents=[common], help="a Slurm batch script: up, check, submit, down",
                       description="Write a Slurm batch script that starts Ray on the allocation (verl-cluster up "
                                   "--slurm), checks it, submits the job and stops Ray on exit.")
    p.add_argument("job", help="job spec (launch/gsm8k.yaml) or a verl script")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="job/verl overrides, passed to submit")
    p.add_argument("--nodes", "-N", type=int, help="nodes (default: the job's trainer.nnodes, else 1)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the job's trainer.n_gpus_per_node)")
    p.add_argument("--cpus-per-node", type=int, help="CPUs per node for Ray (sbatch --cpus-per-task)")
    p.add_argument("--time", "-t", help="time limit (Slurm format: 4:00:00, 1-00:00:00)")
    p.add_argument("--partition", "-p", help="Slurm partition")
    p.add_argument("--account", "-A", help="Slurm account")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="an extra #SBATCH line, e.g. --sbatch-arg=--constraint=h100 (repeatable)")
    p.add_argument("--cluster-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a cluster config override for up/check/down, e.g. ray.object_store_memory=2e9 (repeatable)")
    p.add_argument("--log-dir", default="logs/verl-cluster", help="a folder every node sees; one folder per job")
    p.add_argument("--no-watch", action="store_true",
                   help="plain submit instead of submit --watch (the default when the job names its checkpoint folder)")
    p.add_argument("-o", "--output", help="where to write the script (default: LOG_DIR/NAME.sbatch)")
    p.add_argument("--dry-run", action="store_true", help="print the script, write nothing")
    p.add_argument("--submit", action="store_true", help="submit it with sbatch")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from verl_cluster.verl_scripts.script_import import load_job_input
    from verl_cluster.slurm.batch import BatchRequest, resolve_log_dir, safe_name, script, submit_script, write_script
    from verl_cluster.config.job_shape import JobShape
    from verl_cluster.slurm.fit import check_fits

    job, _ = load_job_input(args.job, list(args.overrides))
    shape = JobShape.of(job)
    want_nodes, want_gpus = shape.nodes, shape.gpus_per_node
    nodes = args.nodes if args.nodes is not None else (want_nodes or 1)
    gpus = args.gpus_per_node if args.gpus_per_node is not None else (want_gpus or 0)
    check_fits(job, nodes, gpus, gpus > 0, f"the request (--nodes {nodes}, --gpus-per-node {gpus})")
    watch, note = _watchable(job) if not args.no_watch else (False, "")
    log_dir = resolve_log_dir(args.log_dir)
    req = BatchRequest(job_file=str(Path(args.job).resolve()), job_name=job.name, nodes=nodes, gpus_per_node=gpus,
                       cpus_per_node=args.cpus_per_node, time=args.time, partition=args.partition,
                       account=args.account, log_dir=log_dir, overrides=list(args.overrides),
                       watch=watch, sbatch_args=list(args.sbatch_arg),
                       cluster_overrides=_cluster_overrides(args.cluster_set))
    text = script(req)
    if note and not args.json:
        err.print(f"[yellow]note:[/] {note}")
    if args.dry_run:
        if args.json:
            print_json({"script": text, "nodes": nodes, "gpus_per_node": gpus, "log_dir": log_dir, "watch": watch,
                        "note": note})
        else:
            out.print(text, markup=False, highlight=False, end="")
        return EXIT_OK
    path = write_script(text, Path(args.output or Path(log_dir) / f"{safe_name(req.job_name)}.sbatch"), log_dir)
    job_id = None
    if args.submit:
        job_id, said = submit_script(path)
        if said:
            err.print(said)
    if args.json:
        print_json({"script": str(path), "job_id": job_id, "log_dir": log_dir, "watch": watch, "note": note})
    elif job_id:
        out.print(f"submitted Slurm job {job_id}: {path}\nlogs: {log_dir}/{job_id}/ (and {log_dir}/slurm-{job_id}.out)"
                  f"\nfollow: squeue -j {job_id}; tail -f {log_dir}/slurm-{job_id}.out")
    else:
        out.print(f"wrote {path}\nsubmit: sbatch {path}   (or run this command again with --submit)")
    return EXIT_OK


def _watchable(job) -> tuple[bool, str]:
    """submit --watch when the job can resume (it names its checkpoint folder), else plain submit, said why."""
    from verl_cluster.watch.settings import check_watchable

    try:
        check_watchable(job)
    except ConfigError as e:
        return False, f"the script runs `submit` without --watch: {e.message.split(': ', 1)[-1]} ({e.hint})"
    return True, ""


def _cluster_overrides(words: list[str]) -> list[str]:
    from verl_cluster.cli.cluster_args import is_override

    bad = [w for w in words if not is_override(w)]
    if bad:
        raise ConfigError(f"--cluster-set {bad[0]}: expected key=value", "e.g. --cluster-set ray.object_store_memory=2e9")
    return list(words)
