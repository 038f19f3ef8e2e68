"""`verl-cluster doctor`: this machine's environment (GPUs, CUDA, torch, NCCL, flash-attn, ...), no config."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from verl_cluster.cli.output import out, print_json
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("doctor", parents=[common], help="check this machine's environment (no config needed)")
    p.add_argument("--json", action="store_true", help="print facts and problems as JSON")
    p.add_argument("--fast", action="store_true", help="read verl's version instead of importing it")
    p.set_defaults(func=run)


def run(args) -> int:
    from verl_cluster.diagnostics.doctor import run_doctor

    report = run_doctor(deep=not args.fast)
    if args.json:
        print_json(report.to_json())
        return EXIT_OK if report.ok else EXIT_UNHEALTHY
    f = report.facts
    t = Table(title=f"doctor: {f.hostname}", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("python", f"{f.python_version} ({f.python_executable})")
    for pkg in ("torch", "torch_cuda", "nccl", "flash_attn", "verl", "ray"):
        t.add_row(pkg, f.versions.get(pkg) or (f"[red]{escape(f.import_errors[pkg][:80])}[/]"
                                               if pkg in f.import_errors else "[dim]not installed[/]"))
    t.add_row("driver / CUDA", f"{f.driver_version or '-'} / {f.cuda_version or '-'}")
    if f.gpus:
        for g in f.gpus:
            t.add_row(f"GPU {g.index}", f"{g.name}, {g.memory_total_mib} MiB, SM {g.compute_capability}, "
                                        f"NVLink {g.nvlink_links_active}")
    else:
        t.add_row("GPUs", f"[yellow]none[/] ({escape(f.nvml_error or '')})")
    if f.gpu_pairs:
        t.add_row("P2P groups", str(f.p2p_islands()))
    t.add_row("RDMA / UCX", f"{','.join(f.rdma_devices) or 'none'} / {f.ucx_version or 'none'} "
                            f"({','.join(f.ucx_transports)})")
    if f.host_python_ms is not None:
        steal = "" if f.host_steal_pct is None else f"; CPU steal {f.host_steal_pct:g}% meanwhile"
        t.add_row("host speed", f"{f.host_python_ms:g} ms for a fixed piece of Python work (less is faster){steal}")
    t.add_row("ulimit -n / memory", f"{f.ulimit_nofile} / {f.mem_total_mib} MiB (swap {f.swap_total_mib} MiB)")
    out.print(t)
    for p in report.problems:
        mark = "[red]✗[/]" if p.severity == "error" else "[yellow]![/]"
        out.print(f"{mark} {escape(p.what)}\n    [dim]fix:[/] {escape(p.fix)}")
    out.print("[bold green]OK[/]" if report.ok else "[bold red]NOT OK[/]")
    return EXIT_OK if report.ok else EXIT_UNHEALTHY
