"""`verl-cluster check CLUSTER.yaml`: connectivity and backend diagnostics before a long run."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from verl_cluster.cli.cluster_args import add_cluster_args, is_override, load_cluster_args
from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY, ConfigError


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):  # 0 would make every connect fail at once (non-blocking socket)
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return v


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("check", parents=[common], help="check nodes, ports, links and backend before a run")
    add_cluster_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quick", action="store_true", help="skip bandwidth, UCX and collective tests")
    p.add_argument("--deep", action="store_true", help="also import verl on every node (slower)")
    p.add_argument("--ucx-tcp", action="store_true", help="run ucx_perftest even on tcp (UCX_TLS=tcp)")
    p.add_argument("--no-collective", action="store_true", help="skip the gloo/NCCL all-reduce tests")
    p.add_argument("--connect-timeout", type=_positive_seconds, default=2.0, metavar="S", help="per TCP connect (2)")
    p.add_argument("--seconds", type=float, default=0.5, metavar="S", help="TCP stream per pair (0.5)")
    # deprecated: overrides are positional key=value in every command
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args) -> int:
    from verl_cluster.diagnostics.check import CheckOptions, run_check

    if args.set:
        bad = [w for w in args.set if not is_override(w)]
        if bad:
            raise ConfigError(f"--set {bad[0]}: expected key=value", "e.g. verl-cluster check ssh.user=me")
        err.print(f"[yellow]warning:[/] `--set` is deprecated: write the override as a word of its own, "
                  f"`verl-cluster check {' '.join(args.set)}`")
        args.overrides = list(args.overrides or []) + args.set
    spec = load_cluster_args(args)
    opts = CheckOptions(quick=args.quick, deep=args.deep, connect_timeout_s=args.connect_timeout,
                        stream_seconds=args.seconds, ucx=True if args.ucx_tcp else None,
                        collective=not args.no_collective)
    report = run_check(spec, options=opts, progress=None if args.json else lambda m: err.print(f"[dim]… {m}[/]"))
    if args.json:
        print_json(report.to_json())
    else:
        print_report(report)
    return EXIT_OK if report.ok else EXIT_UNHEALTHY


def _fmt(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def print_report(r) -> None:
    nodes = Table(title="nodes", title_justify="left")
    for c in ("node", "interface", "python", "ray", "torch", "verl", "GPUs", "clock Δs"):
        nodes.add_column(c)
    for host, f in r.facts.items():
        gpus = f"{len(f.gpus)}× {f.gpus[0].name}" if f.gpus else "0"
        nodes.add_row(host, r.choice.interfaces.get(host, "?"), f.python_version or "-", f.versions.get("ray", "-"),
                      f.versions.get("torch", "-"), f.versions.get("verl", "-"), gpus, _fmt(f.clock_offset_s, 3))
    for host, why in r.unreachable.items():
        state = "not probed" if host in getattr(r, "not_probed", {}) else "unreachable"
        nodes.add_row(host, f"[red]{state}[/]", escape(why[:60]), "", "", "", "", "")
    out.print(nodes)
    out.print(f"[bold]backend:[/] {r.backend}")
    for reason in r.choice.reasons:
        out.print(f"  {escape(reason)}")
    if r.matrix:
        blocked = r.matrix.blocked()
        state = "live cluster" if r.matrix.live else "test listeners"
        out.print(f"[bold]ports:[/] {len(r.matrix.results) - len(blocked)}/{len(r.matrix.results)} open ({state})")
    if r.listeners:
        t = Table(title="ports our Ray listens on", title_justify="left")
        for c in ("node", "port", "config key", "bound to", "process", "without the token"):
            t.add_column(c)
        for host, rows in r.listeners.items():
            worker = [x for x in rows if x["name"] == "worker"]
            for x in [x for x in rows if x["name"] != "worker"] + worker[:3]:
                t.add_row(host, str(x["port"]), x["name"] or "[yellow]not pinned[/]", x["address"],
                          escape(x["process"]), escape(x.get("answer", "")))
            if len(worker) > 3:
                t.add_row(host, "", "worker", "", f"{len(worker) - 3} more worker ports", "")
        out.print(t)
    if r.links:
        t = Table(title="links", title_justify="left")
        for c in ("src", "dst", "latency ms (rtt)", "TCP Gbit/s"):
            t.add_column(c)
        for link in r.links:
            t.add_row(link.src, link.dst, _fmt(link.latency_ms, 3), _fmt(link.bandwidth_gbps) if not link.error
                      else f"[red]{escape(link.error[:50])}[/]")
        out.print(t)
    if r.ucx_links:
        t = Table(title="ucx_perftest tag_bw", title_justify="left")
        for c in ("src", "dst", "Gbit/s"):
            t.add_column(c)
        for link in r.ucx_links:
            t.add_row(link.src, link.dst, _fmt(link.ucx_bandwidth_gbps) if not link.error else "[red]failed[/]")
        out.print(t)
    for c in r.collectives:
        nodes = f", {c.nodes} node(s)" if c.nodes else ""
        t = Table(title=f"{c.backend} all-reduce ({c.world} ranks{nodes})", title_justify="left")
        for col in ("size", "time µs", "algbw GB/s", "busbw GB/s", "correct"):
            t.add_column(col)
        for row in c.results:
            t.add_row(f"{row['size'] / 2**20:g} MiB", _fmt(row["time_us"], 1), _fmt(row["algbw_gbs"], 3),
                      _fmt(row["busbw_gbs"], 3), str(row["correct"]))
        out.print(t)
        if c.ok and c.backend == "nccl":
            out.print(f"[dim]kept for `plan -c`: FSDP traffic on {r.cluster} is charged at the largest size's "
                      "busbw for 7 days[/]")
    for section, why in r.skipped.items():
        out.print(f"[dim]skipped {section}: {escape(why)}[/]")
    if r.problems:
        t = Table(title="problems", title_justify="left")
        for c in ("", "node", "what", "fix"):
            t.add_column(c)
        for p in r.problems:
            mark = "[red]✗[/]" if p.severity == "error" else "[yellow]![/]"
            t.add_row(mark, escape(p.node), escape(p.what), escape(p.fix))
        out.print(t)
    errors = sum(p.severity == "error" for p in r.problems)
    if r.ok:
        out.print(f"[bold green]OK[/] ({len(r.problems)} warnings, {r.seconds:.1f}s)")
    else:
        out.print(f"[bold red]NOT OK[/]: {errors} problem(s) to fix ({r.seconds:.1f}s)")
