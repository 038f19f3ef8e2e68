"""`up`, `down`, `status`, `forget`."""

from __future__ import annotations

import argparse
import os
import threading
import time

from rich.live import Live
from rich.markup import escape
from rich.table import Table

from verl_cluster.cli.cluster_args import add_cluster_args, cluster_word, load_cluster_args
from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY, ConfigError
from verl_cluster.records import job_records
from verl_cluster.records.job_records import record_cluster, record_down

_UP_HELP = """\
Which cluster (every command): -c X is a cluster file when that path exists, else the name of a
cluster recorded on this machine (`up` records each cluster once its head came up, under
~/.verl-cluster/clusters/); without -c, $VERL_CLUSTER (a file or a name); else the one cluster
recorded as up; else this machine as a one-node cluster (the default shipped with the package).
Each command says on stderr which cluster it used."""


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("up", parents=[common], help="start or heal the Ray cluster", epilog=_UP_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_args(p)
    p.add_argument("--restart", action="store_true", help="restart every node (applies a changed config)")
    p.add_argument("--dry-run", action="store_true", help="print what would run on each node, then stop")
    p.add_argument("--no-check", action="store_true", help="skip the quick connectivity check at the end")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.set_defaults(func=run_up)

    p = sub.add_parser("down", parents=[common], help="stop exactly what `up` started")
    add_cluster_args(p)
    p.add_argument("--force", action="store_true",
                   help="run `ray stop --force` on every node: kills ALL Ray processes there, other users' too")
    p.add_argument("--forget", action="store_true",
                   help="then drop what this machine recorded of it (its record, its jobs' records), stopped or not: "
                        "for a cluster gone for good (exit 1 still says what could not be stopped)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_down)

    p = sub.add_parser("forget", parents=[common], help="drop a cluster's records here (nothing is stopped)",
                       description="Drop what this machine recorded of a cluster (~/.verl-cluster/clusters/NAME.json "
                                   "and the records of the jobs submitted to it), so that `jobs` no longer asks it and "
                                   "-c NAME no longer names it. Nothing is stopped; its token file stays.")
    p.add_argument("names", nargs="+", metavar="NAME", help="a recorded cluster name (see `verl-cluster jobs`), or "
                                                             "its cluster file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_forget)

    p = sub.add_parser("status", parents=[common], help="nodes, resources, versions, jobs")
    add_cluster_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_status)


# ---------------- up ----------------

class _ProgressTable:
    """Live per-node progress on stderr."""

    def __init__(self, spec, enabled: bool):
        self.rows = {n.host: ("head" if r == "head" else "worker", "waiting", time.monotonic())
                     for r, n in spec.nodes()}
        self.lock = threading.Lock()
        self.live = Live(self.render(), console=err, refresh_per_second=8, transient=True) if enabled else None

    def render(self) -> Table:
        t = Table(title="verl-cluster up", show_edge=False)
        for c in ("node", "role", "state", "s"):
            t.add_column(c)
        for host, (role, msg, t0) in self.rows.items():
            t.add_row(host, role, msg, f"{time.monotonic() - t0:.1f}")
        return t

    def update(self, host: str, msg: str) -> None:
        with self.lock:
            role, _, t0 = self.rows.get(host, ("?", "", time.monotonic()))
            self.rows[host] = (role, msg, t0)
            if self.live:
                self.live.update(self.render())

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)


def print_check(report) -> None:
    """The quick check's verdict and problems, under the `up` table."""
    verdict = "[green]ok[/]" if report.ok else "[red]problems found[/]"
    out.print(f"quick check: {verdict} ({report.seconds:.1f}s)")
    for p in report.problems:
        tag = "[red]error[/]" if p.severity == "error" else "[yellow]warning[/]"
        out.print(f"  {tag} {escape(p.node)}: {escape(p.what)}  [dim]fix: {escape(p.fix)}[/]")


def run_up(args) -> int:
    from verl_cluster.lifecycle.bring_up import bring_up, plan
    from verl_cluster.lifecycle.up import NodeAction

    spec = load_cluster_args(args)
    planned = plan(spec)  # refuses an open dashboard before anything else is said or done
    warn_open(spec)
    if args.dry_run:
        if args.json:
            print_json({"cluster": spec.cluster_name,
                        "nodes": [p.command.to_json() | {"cwd": spec.temp_dir} for p in planned]})
        else:
            for p in planned:
                c = p.command
                out.print(f"[bold]{c.role} {escape(c.host)}[/] ({c.ip})")
                out.print("  env:  " + escape(" ".join(f"{k}={v}" for k, v in sorted(c.masked_env().items()))))
                out.print("  argv: " + escape(" ".join(c.argv)))
                out.print(f"  cwd:  {escape(spec.temp_dir)} (made on the node, its parent 0700)")
                if p.via:  # how it reaches the node, e.g. one Slurm step that holds Ray
                    out.print("  via:  " + escape(" ".join(p.via)))
            out.print("(dry run: nothing was started; backend env from `check` is added at `up` time)")
        return EXIT_OK
    with _ProgressTable(spec, enabled=not args.json and err.is_terminal) as prog:
        done = bring_up(spec, restart=args.restart, progress=prog.update if not args.json else None)
    report, reasons = done.report, done.reasons
    came_up = any(n.role == "head" and n.ok for n in report.nodes)
    if came_up:  # from now on `jobs` asks it and -c NAME names it; a failed `up` leaves no record, nor its overrides
        record_cluster(spec.cluster_name, args.cluster, args.overrides)
    if not args.json:
        t = Table(title=f"cluster {spec.cluster_name}: {'healthy' if report.healthy else 'NOT healthy'} "
                        f"({report.seconds:.1f}s)")
        for c in ("node", "role", "address", "result", "CPUs", "GPUs", "reason"):
            t.add_column(c)
        for n in report.nodes:
            color = "green" if n.ok else ("yellow" if n.action == NodeAction.CHANGED else "red")
            t.add_row(n.host, n.role, n.ip, f"[{color}]{n.action}[/]", _num(n.cpus), _num(n.gpus),
                      escape(n.reason))
        out.print(t)
        for n in report.nodes:
            if n.log_tail:
                out.print(f"[red]{escape(n.host)}[/] last lines:\n{escape(n.log_tail)}")
        for r in reasons:
            out.print(f"backend: {escape(r)}")
    check = None if args.no_check else done.quick_check()
    if check is not None and not args.json:
        print_check(check)
    if args.json:
        print_json(report.to_json() | {"backend_reasons": reasons, "check": check.to_json() if check else None})
    elif report.healthy:
        name = escape(spec.cluster_name)  # recorded just now: its name works from any directory
        out.print(f"next: verl-cluster status -c {name}   |   stop: verl-cluster down -c {name}")
    return EXIT_OK if done.healthy else EXIT_UNHEALTHY


def warn_open(spec) -> None:
    """Loud, on stderr, before anything else: a cluster others can run code on."""
    from verl_cluster.nodes.auth import open_cluster_warnings

    for w in open_cluster_warnings(spec):
        err.print(f"[bold red]WARNING:[/] {escape(w)}")


def _num(x) -> str:
    return "" if x is None else f"{x:g}"


# ---------------- down ----------------

def run_down(args) -> int:
    from verl_cluster.lifecycle.down import down

    spec = load_cluster_args(args)
    if args.force:
        err.print("[yellow]warning:[/] --force runs `ray stop --force`: every Ray process on these hosts dies, "
                  "including other users' and other clusters'.")
    results = down(spec, force=args.force)
    ok = all(r.ok for r in results)
    forgotten = job_records.forget(spec.cluster_name) if args.forget else None
    if ok and not args.forget:  # `jobs` names it down instead of asking it, until `up` or `submit` uses it again
        record_down(spec.cluster_name, args.cluster, args.overrides)
    if args.json:
        print_json({"cluster": spec.cluster_name, "ok": ok, "nodes": [r.to_json() for r in results]}
                   | ({"forgotten": [str(p) for p in forgotten]} if forgotten is not None else {}))
    else:
        t = Table(title=f"cluster {spec.cluster_name}: {'stopped' if ok else 'NOT fully stopped'}")
        for c in ("node", "role", "result"):
            t.add_column(c)
        for r in results:
            if r.error:
                res = f"[red]{escape(r.error)}[/]"
            elif r.left:
                res = f"[red]{len(r.left)} processes still running: {r.left}[/]"
            elif r.stopped > 0:
                res = f"[green]stopped {r.stopped} processes[/] ({', '.join(r.kinds[:6])})"
            elif r.stopped < 0:
                res = "[green]ray stop --force done[/]"
            else:
                res = "nothing was running"
            t.add_row(r.host, r.role, res)
        out.print(t)
    if forgotten is not None:
        _say_forgotten(spec.cluster_name, forgotten)
    elif not ok and any(k.name == spec.cluster_name for k in job_records.known_clusters()):
        word = escape(cluster_word(args, spec))
        err.print(f"[dim]gone for good? `verl-cluster down --forget -c {word}` (or `verl-cluster forget "
                  f"{escape(spec.cluster_name)}`) drops what this machine recorded of it[/]")
    return EXIT_OK if ok else EXIT_UNHEALTHY


# ---------------- forget ----------------

def run_forget(args) -> int:
    """Every name is checked before anything is removed: one typo forgets nothing."""
    known = {k.name for k in job_records.known_clusters()}
    names = []
    for word in args.names:
        if word in known:
            names.append(word)
            continue
        if os.path.isfile(os.path.expanduser(word)):
            from verl_cluster.launchers import load_cluster

            name = load_cluster(os.path.expanduser(word)).cluster_name
            if name in known:
                names.append(name)
                continue
            raise ConfigError(f"{word} names cluster `{name}`, which nothing on this machine records",
                              f"recorded here: {', '.join(sorted(known)) or 'none'}")
        raise ConfigError(f"`{word}`: no cluster of that name is recorded on this machine",
                          f"recorded here: {', '.join(sorted(known)) or 'none'} (see `verl-cluster jobs`)")
    done = {name: job_records.forget(name) for name in dict.fromkeys(names)}
    left = [n for n in done if n in {k.name for k in job_records.known_clusters()}]
    if args.json:
        print_json({"forgotten": [{"cluster": n, "removed": [str(p) for p in ps]} for n, ps in done.items()],
                    "not_removed": left})
    else:
        for name, paths in done.items():
            _say_forgotten(name, paths)
    if left:
        err.print(f"[red]error:[/] could not remove the records of {', '.join(left)} under "
                  f"{escape(str(job_records.clusters_dir().parent))} (is it writable?)")
        return EXIT_UNHEALTHY
    return EXIT_OK


def _say_forgotten(name: str, paths) -> None:
    jobs = sum(1 for p in paths if p.parent == job_records.jobs_dir())
    what = ("its record" if any(p.parent == job_records.clusters_dir() for p in paths) else "no cluster record") + \
        f" and {jobs} job record{'s' if jobs != 1 else ''}"
    err.print(f"forgot {escape(name)}: removed {what}; nothing was stopped and its token file stays")


# ---------------- status ----------------

def run_status(args) -> int:
    from verl_cluster.lifecycle.status import cluster_status

    spec = load_cluster_args(args)
    warn_open(spec)
    st = cluster_status(spec)
    command = f"verl-cluster dashboard -c {cluster_word(args, spec)}"
    if args.json:
        print_json(st.to_json() | {"dashboard_command": command})
    else:
        render_status(st, command)
    return EXIT_OK if st.healthy else EXIT_UNHEALTHY


def render_status(st, dashboard_command: str) -> None:
    from verl_cluster.lifecycle.status import NodeState

    verdict = "a Ray not started by verl-cluster" if st.other_ray else ("healthy" if st.healthy else "NOT healthy")
    t = Table(title=f"cluster {st.cluster} (GCS {st.head_address}): {verdict}")
    for c in ("node", "role", "address", "state", "CPUs", "GPUs", "GPU model", "free GPUs", "Ray", "Python", "reason"):
        t.add_column(c)
    for n in st.nodes:
        color = {NodeState.ALIVE: "green", NodeState.DEAD: "red", NodeState.MISSING: "yellow",
                 NodeState.OTHER_RAY: "cyan"}.get(n.state, "red")
        models = sorted(set(n.gpu_models))
        model = f"{models[0]} ({n.gpu_memory_mib[0] // 1024} GiB)" if len(models) == 1 else ", ".join(models)
        free = "" if n.available is None else _num(n.available.get("GPU", 0.0))
        t.add_row(n.host, n.role, n.ip, f"[{color}]{n.state}[/]", _num(n.cpus), _num(n.gpus), model, free,
                  n.ray_version or "", n.python_version or "", escape(n.reason))
    out.print(t)
    if st.jobs:
        j = Table(title="running jobs")
        for c in ("id", "status", "entrypoint"):
            j.add_column(c)
        for job in st.jobs:
            j.add_row(job["id"], job["status"], escape(job["entrypoint"][:80]))
        out.print(j)
    else:
        out.print("no running jobs")
    for x in st.extra_nodes:
        out.print(f"[yellow]note:[/] node {x['ip']} is in the cluster but not in the config")
    for n in st.nodes:
        if n.other_clusters:  # verl's weight-sync sockets in /tmp are named by Ray job ids each cluster counts from 1
            out.print(f"[yellow]note:[/] {escape(n.host)} also runs Ray of cluster(s) "
                      f"{escape(', '.join(n.other_clusters))}: verl jobs of both would share its /tmp (submit warns)",
                      soft_wrap=True)
    if st.other_ray:
        alive = sum(1 for n in st.nodes if n.state == NodeState.OTHER_RAY) + len(st.extra_nodes)
        out.print(f"[cyan]note:[/] a Ray not started by verl-cluster holds {st.head_address} ({alive} node(s) alive "
                  "in its GCS, shown above). verl-cluster does not manage it: `down` does not stop it and `up` "
                  "cannot start ours on the same ports; to use it with verl-cluster, stop it where it was started "
                  "(`ray stop` there stops every Ray on that machine), then `verl-cluster up`", soft_wrap=True)
    for p in st.problems:
        out.print(f"[yellow]problem:[/] {escape(p)}")
    if st.dashboard_on_head_only:  # an address on the head's loopback: only a tunnel reaches it from here
        out.print(f"dashboard: {escape(dashboard_command)}  (SSH tunnel to the head's loopback)")
    else:
        out.print(f"dashboard: {st.dashboard}  (with the token: {escape(dashboard_command)})")
