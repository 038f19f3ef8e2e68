"""Rich output for a Plan: a table per role, a node x GPU map with memory bars, reasons, overrides."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verl_cluster.placement.envelope import range_text, step_range
from verl_cluster.placement.plan import Plan

BAR = 20
MAP_NODES = 8  # show at most this many nodes in the map (all nodes of a pool are identical)


def _bar(used: float, cap: float) -> str:
    share = 0.0 if cap <= 0 else min(used / cap, 1.0)
    n = round(share * BAR)
    colour = "green" if used <= 0.85 * cap else ("yellow" if used <= cap else "red")
    return f"[{colour}]{'█' * n}[/]{'░' * (BAR - n)} {used:5.1f}/{cap:.0f} GiB"


def render_lengths(plans, shown: Plan, con: Console) -> None:
    """The lengths planned at (and where each came from), then the verdict at the worst case and at them."""
    L = plans.lengths
    if not L.known:
        con.print(f"[bold]lengths[/] worst case, every sequence {L.prompt_limit}+{L.response_limit} tokens "
                  "[dim](nothing known of the real lengths: --data FILE.parquet, placement.mean_response_tokens, "
                  "--fill)[/]")
        return
    con.print(f"[bold]lengths[/] {escape(L.line())}")
    if L.prompts is not None and L.prompts.over_limit:
        p = L.prompts
        con.print(f"  [yellow]{p.over_limit} of {p.sampled} sampled prompts are longer than data.max_prompt_length "
                  f"({p.limit}; longest {p.max})[/]")

    def verdict(p: Plan) -> str:
        if p.not_covered:
            return "[yellow]not checked[/] (Megatron)"
        if not p.feasible:
            return f"[red]does not fit[/] — {escape(p.binding)}"
        return "fits" + (" [yellow](at the GPU's limit)[/]" if p.at_limit_phases() else "")

    con.print(f"  worst case ({L.prompt_limit}+{L.response_limit} tokens every sequence): {verdict(plans.worst)}")
    if plans.known is not None:
        con.print(f"  at these lengths (fill {L.fill:.3g}): {verdict(plans.known)}")
    if plans.padded:
        from verl_cluster.placement.length_plans import PADDED

        con.print(f"  [dim]{escape(PADDED)}[/]")
    if shown is plans.worst and plans.known is not None and plans.known.feasible:
        con.print("  [dim]shown: the worst case's plan (room for any lengths), which submit runs[/]")
    elif shown is plans.known and plans.verdict == "fits-at-known-lengths":
        con.print("  [yellow]shown: the plan at these lengths; longer sequences can run out of memory[/]")


def render(plan: Plan, con: Console, *, brief: bool = False, lengths=None) -> None:
    """The answer first (verdict, binding constraint, fix, feasible options), the tables after. `lengths`: the
    LengthPlans the plan came from (its lengths and both verdicts are shown after the verdict)."""
    _verdict(plan, con, lengths)
    if plan.feasible:
        _overrides(plan, con)
    if brief:
        _error_bar(plan, con)
        return
    for role in plan.roles:
        t = Table(title=f"{role.role} · {role.pool} · {len(role.gpus)} GPU(s)", title_justify="left")
        t.add_column("phase")
        t.add_column("micro", justify="right")
        t.add_column("tokens", justify="right")
        t.add_column("own GiB/GPU (by component)")
        t.add_column("peak GiB/GPU", justify="right")
        for ph in role.phases:
            comps = ", ".join(f"{c.name} {c.gib:.2f}" for c in ph.components if c.gib >= 0.005)
            peak = f"{ph.peak_gib:.1f}" if ph.fits else f"[red]{ph.peak_gib:.1f}[/]"
            if ph.at_limit:  # runs because the allocator gives its cache back
                peak = f"[yellow]{ph.peak_gib:.1f} at the limit[/]"
            t.add_row(ph.phase, "-" if ph.micro_batch is None else str(ph.micro_batch), str(ph.tokens),
                      escape(comps), peak)
        extra = f"resident between phases {role.resident_gib:.2f} GiB/GPU; host {role.host_gib_per_gpu:.2f} GiB/GPU"
        t.caption = extra
        t.caption_justify = "left"
        con.print(t)
    _gpu_map(plan, con)
    ram = f" of {plan.host_mem_gib:.0f} GiB RAM" if plan.host_mem_gib is not None else " (node RAM unknown: --host-mem)"
    con.print(f"host memory per node: needs {plan.host_gib_per_node:.1f} GiB{ram}")
    if plan.nnodes > 1:  # the driver's processes run once per job: the other nodes need less
        con.print(f"  the other {plan.nnodes - 1} node(s): {plan.host_worker_gib:.1f} GiB each between saves (no "
                  f"driver); all {plan.nnodes} nodes together {plan.host_cluster_gib:.1f} GiB", style="dim")
    if plan.host_parts:
        con.print("  " + escape("; ".join(f"{k} {v:.1f}" for k, v in plan.host_parts.items() if v >= 0.05)),
                  style="dim")
    _time(plan, con)
    con.print("[bold]reasons[/]")
    for r in plan.reasons:
        con.print(f"  • {escape(r)}")
    for w in plan.warnings:
        con.print(f"  [yellow]warning:[/] {escape(w)}")
    if plan.problems:
        con.print("[bold red]as written[/]")
        for p in plan.problems:
            con.print(f"  ✗ {escape(p)}")
        con.print("[bold]verl overrides[/] (of the closest setting shown above)")
        for k, v in plan.overrides.items():
            con.print(f"  {escape(k)}={escape(_fmt(v))}")


def _time(plan: Plan, con: Console) -> None:
    """Predicted seconds per step, by phase (verl's timing_s names), at the lengths planned."""
    t = plan.time
    if not t:
        return
    if not plan.feasible:  # a setting that does not fit (a rollout with no KV cache) has no meaningful step time
        more = " (each feasible plan above shows its own)" if plan.options else ""
        con.print(f"step time: not predicted for a setting that does not fit{more}")
        return
    phases = ", ".join(f"{k} {v:.1f}" for k, v in t["phases_s"].items())
    save = f"; checkpoint save {t['save_checkpoint_s']:.1f} s each" if t["save_checkpoint_s"] else ""
    con.print(f"step time (predicted, fill {plan.fill:.2g}): {t['step_s']:.1f} s — {escape(phases)}{save}; "
              f"~{t['tokens_per_gpu_s']:.0f} tokens/GPU/s")
    _error_bar(plan, con)
    for n in t.get("notes", []):
        con.print(f"  [dim]{escape(n)}[/]")


def _error_bar(plan: Plan, con: Console) -> None:
    """The step's error bar: what the model was calibrated on says how far the predicted step may be off, and which
    way: the runs it comes from, measured against their plans."""
    t = plan.time or {}
    bar = t.get("error_bar")
    if bar and plan.feasible:
        pct = f"±{bar['pct']}%: " if bar["pct"] else ""
        got = step_range(t["step_s"], bar)
        host = (bar.get("host") or {}).get("error", 0.0) >= bar.get("over", 0.0) > 0  # the fastest host sets it
        seen = (f"; as those runs{' and the fastest host recorded' if host else ''} came in against their plans, "
                f"this step would take {range_text(*got)}" if got else "")
        con.print(f"  step time {pct}{escape(bar['why'])}{seen}", style=None if bar["calibrated"] else "yellow")


def _pct(bar: Optional[dict], step_s: Optional[float] = None) -> str:
    """' (±20%)', ' (±35%, uncalibrated)' or '' without a bar; with STEP_S the seconds it may come in between:
    ' (±80%, uncalibrated: 5.2-12 s)'."""
    if not bar or not bar.get("pct"):
        return ""
    got = step_range(step_s, bar) if step_s else None
    return (f" (±{bar['pct']}%" + ("" if bar["calibrated"] else ", uncalibrated")
            + (f": {range_text(*got)}" if got else "") + ")")


def _per_step(t: dict) -> str:
    """'~26 s/step predicted (±20%: 22-33 s)' for the verdict line."""
    return f"; ~{t['step_s']:.0f} s/step predicted{_pct(t.get('error_bar'), t['step_s'])}"


def _verdict(plan: Plan, con: Console, lengths=None) -> None:
    head = f"[bold]plan[/] {escape(plan.model)} ({plan.params / 1e9:.2f}B) on {escape(plan.hardware)}: "
    if plan.not_covered:
        con.print(head + f"[bold yellow]memory not checked[/] — {escape(plan.not_covered)}")
        return
    if plan.feasible:
        tight = max(plan.gpus, key=lambda g: g.peak_gib / (g.capacity_gib or plan.capacity_gib), default=None)
        peak, cap = (tight.peak_gib, tight.capacity_gib or plan.capacity_gib) if tight else (0.0, plan.capacity_gib)
        limit = plan.at_limit_phases()
        verdict = (f"[bold yellow]fits at the GPU's limit[/] ({escape(', '.join(limit))}: no room for longer "
                   "sequences than planned)" if limit else "[bold green]fits[/]")
        if lengths is not None and plan is lengths.known and not lengths.worst.feasible:
            verdict += f" [yellow]at the lengths known (fill {plan.fill:.3g}), not at the worst case[/]"
        con.print(head + f"{verdict} — peak {peak:.1f} of {cap:.1f} GiB/GPU; "
                  f"strategy {plan.strategy}, TP {plan.tp}, offload {plan.offload}, {plan.dtype}, {plan.attn}"
                  + (_per_step(plan.time) if plan.time else ""), soft_wrap=True)  # one line, whatever the width
        if lengths is not None:
            render_lengths(lengths, plan, con)
        return
    con.print(head + "[bold red]does not fit as written[/]")
    if lengths is not None:
        render_lengths(lengths, plan, con)
    con.print(f"  [bold]binding constraint:[/] {escape(plan.binding or '; '.join(plan.problems))}")
    con.print(f"  [bold]fix:[/] {escape(plan.fixes[0] if plan.fixes else 'none found')}")
    if not plan.options:
        return
    con.print("[bold]feasible plans[/] (best first; `plan` with an option's overrides shows its tables)")
    for i, o in enumerate(plan.options, 1):
        con.print(f"  [bold]{i}.[/] {escape('; '.join(o.changes) or 'as written')} — {o.strategy}, TP {o.tp}, "
                  f"{_offload(o.offload)}, peak {o.peak_gib:.1f} GiB/GPU, "
                  f"~{o.step_s:.0f} s/step{_pct(o.error_bar, o.step_s)}")
        con.print("     " + escape(" ".join(f"{k}={_fmt(v)}" for k, v in o.overrides.items())), soft_wrap=True)


def _offload(name: str) -> str:
    return "no offload" if name == "none" else f"{name} offload"


def _overrides(plan: Plan, con: Console) -> None:
    con.print("[bold]verl overrides[/]")
    for k, v in plan.overrides.items():
        con.print(f"  {escape(k)}={escape(_fmt(v))}")


def _fmt(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _gpu_map(plan: Plan, con: Console) -> None:
    t = Table(title="GPU map", title_justify="left")
    t.add_column("node")
    t.add_column("gpu", justify="right")
    t.add_column("roles")
    t.add_column("peak (phase)")
    t.add_column("memory")
    nodes = sorted({g.node for g in plan.gpus})
    for g in plan.gpus:
        if g.node not in nodes[:MAP_NODES]:
            continue
        t.add_row(escape(g.host), str(g.gpu), ",".join(g.roles), g.peak_phase, _bar(g.peak_gib, g.capacity_gib or plan.capacity_gib))
    if len(nodes) > MAP_NODES:
        t.caption = f"... {len(nodes) - MAP_NODES} more nodes, laid out the same"
    con.print(t)
