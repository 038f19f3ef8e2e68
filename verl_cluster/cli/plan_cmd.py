"""`verl-cluster plan JOB.yaml`: where each verl role goes, memory per GPU, and the verl overrides.

Hardware, first that applies: --gpus SPEC (hypothetical), --facts FILE.json (recorded NodeFacts), --cluster
CLUSTER.yaml (facts gathered from every node of a live cluster), the job's placement.gpus, else this machine's
GPUs (the diagnostics probe, NVML). Exit 0 fits, 1 does not fit or a node is unreachable, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNHEALTHY, ConfigError
from verl_cluster.facts.model import NodeFacts, from_dict
from verl_cluster.placement import parse_gpus
from verl_cluster.placement.gpus import GPU_EXAMPLE
from verl_cluster.placement.planner import STRATEGIES


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("plan", parents=[common], help="place verl roles on GPUs: memory per GPU and verl overrides",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="job spec (launch/*.yaml), a verl script (run_qwen2-7b.sh), or -- python3 -m ...")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="job fields or verl overrides")
    p.add_argument("--gpus", help=f"hypothetical hardware NODESxGPUSxMODEL, e.g. {GPU_EXAMPLE}, 1x2x48GB@8.9")
    p.add_argument("--facts", help="JSON list of NodeFacts (recorded by the diagnostics gatherer)")
    p.add_argument("-c", "--cluster", metavar="CLUSTER.yaml",
                   help="gather the facts of every node of this cluster (SSH/local, as `doctor` does)")
    p.add_argument("--slurm", action="store_true", help="gather the facts of this Slurm allocation's nodes")
    p.add_argument("--strategy", choices=STRATEGIES + ("auto",), help="default: the job's placement.strategy")
    p.add_argument("--fill", type=float, default=None,
                   help="average share of prompt+response a sequence uses (1.0: worst case); shows the plan at it. "
                        "Default: the job's placement.fill, else the lengths measured (--data) or logged by an "
                        "earlier run of the job, planned beside the worst case")
    p.add_argument("--data", action="append", metavar="FILE.parquet",
                   help="measure the prompts of this training parquet (verl's format) with the model's tokenizer "
                        "when it is on this machine, else from characters; repeatable")
    p.add_argument("--host-mem", type=float, metavar="GIB",
                   help="host RAM per node in GiB (default: the nodes' facts; for --gpus the GPU catalog's typical "
                        "server, never this machine's)")
    p.add_argument("--brief", action="store_true", help="only the verdict, the binding constraint, the fix and "
                                                        "the options (no tables)")
    p.add_argument("--factors", metavar="FILE.json",
                   help="multiply each phase's predicted seconds, the checkpoint save and host RAM by the factors "
                        "measured on earlier runs (scripts/plan_factors.py --out FILE from `jobs --json`); the step "
                        "is the sum of its phases, and the notes say which factors were applied, from how many runs; "
                        "the file's host_factor (the host's speed that explained earlier jobs) takes the phases to "
                        "that speed in place of their own factors. Without a file the plan starts from the host "
                        "speed earlier runs showed on the same machines (placement.host_factor=auto; off: the "
                        "calibrated hosts'; or a number from 0.5 to 2)")
    add_model_config(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def add_model_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-config", metavar="FILE",
                   help="the model's config.json (from its Hugging Face repo) for a model the catalog lacks; the "
                        "planner reads its shape (dense models only), verl still loads the job's model.path")


def model_config_word(args: argparse.Namespace) -> list[str]:
    """--model-config FILE as the job field it sets (model.config=ABSOLUTE), checked here: a file that is not a
    dense model's config.json is bad input before anything else runs."""
    path = getattr(args, "model_config", None)
    if not path:
        return []
    from verl_cluster.placement.model_shape import shape_from_file

    shape_from_file(path)  # ConfigError (exit 2): missing, not JSON, no shape, mixture-of-experts
    return [f"model.config={Path(path).expanduser().resolve()}"]


def read_facts_file(path: str) -> list[NodeFacts]:
    from verl_cluster.config.loader import read_text_bounded

    text = read_text_bounded(path, "facts file")  # 1 MiB at most: recorded facts are a few KB a node
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--facts {path}: invalid JSON: {e.msg} (line {e.lineno})")
    except RecursionError:
        raise ConfigError(f"--facts {path}: invalid JSON: nested too deep")
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):  # `verl-cluster doctor --json` as it prints
        data = data["facts"]
    if isinstance(data, dict):
        data = data.get("nodes", [data]) if "host" in data or "nodes" in data else None
    how = "record them on each node with `verl-cluster doctor --json > NODE.json` (a list of them, or one)"
    if not isinstance(data, list) or not all(isinstance(d, dict) and "host" in d for d in data):
        raise ConfigError(f"--facts {path}: expected a JSON list of node facts (objects with `host`)", how)
    try:
        nodes = [from_dict(NodeFacts, d, f"[{i}]") for i, d in enumerate(data)]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--facts {path}: not node facts: {e}", how)
    for i, n in enumerate(nodes):  # values the planner divides by or parses
        for j, g in enumerate(n.gpus):
            at = f"--facts {path}: [{i}].gpus[{j}]"
            if g.memory_total_mib <= 0 or (g.memory_free_mib or 0) < 0:
                raise ConfigError(f"{at}: memory_total_mib must be above 0 and memory_free_mib not below 0, got "
                                  f"{g.memory_total_mib} and {g.memory_free_mib}", how)
            if not re.fullmatch(r"\d+(\.\d+)?", g.compute_capability):
                raise ConfigError(f"{at}.compute_capability must be like \"9.0\", got {g.compute_capability!r}", how)
    return nodes


def local_node_facts() -> NodeFacts:
    """This machine, as the diagnostics probe sees it (NVML via ctypes: GPUs, P2P/NVLink pairs, and the
    package facts - torch, flash-attn - the planner's dtype and attention choices read)."""
    from verl_cluster.diagnostics.gather import local_facts
    from verl_cluster.facts.ray_view import as_ray_sees

    return as_ray_sees(local_facts(head_ip=None, deep=False), None)  # this shell's CUDA_VISIBLE_DEVICES counts


def hardware(args: argparse.Namespace, job_gpus: str | None) -> list[NodeFacts]:
    """The nodes to plan for; --host-mem replaces every node's RAM (hypothetical or recorded)."""
    ram = getattr(args, "host_mem", None)
    if ram is not None and not ram > 0:
        raise ConfigError(f"--host-mem: must be a positive number of GiB, got {ram}", "e.g. --host-mem 1024")
    facts = _hardware(args, job_gpus)
    return facts if ram is None else [replace(nf, mem_total_mib=int(ram * 1024)) for nf in facts]


def _hardware(args: argparse.Namespace, job_gpus: str | None) -> list[NodeFacts]:
    if args.gpus:
        return parse_gpus(args.gpus)
    if args.facts:
        return read_facts_file(args.facts)
    if getattr(args, "slurm", False) and not getattr(args, "cluster", None):
        from verl_cluster.launchers import allocation_cluster

        args.cluster, _ = allocation_cluster(None)  # the file written for the allocation names its launcher
    if getattr(args, "cluster", None):
        from verl_cluster.launchers import load_cluster
        from verl_cluster.diagnostics.cluster_facts import gather_node_facts

        from verl_cluster.cli.cluster_args import say_cluster

        spec = load_cluster(args.cluster)
        say_cluster(spec.cluster_name, getattr(args, "chosen", None))
        return gather_node_facts(spec)  # RunnerError (exit 1) names an unreachable node
    if job_gpus:
        return parse_gpus(job_gpus)
    local = local_node_facts()
    if not local.gpus:
        why = f" ({local.nvml_error})" if local.nvml_error else ""
        raise ConfigError(f"no GPUs on this machine{why} and no hardware given",
                          f"plan for hypothetical hardware: --gpus {GPU_EXAMPLE} (or --facts FILE.json)")
    return [local]


def run(args: argparse.Namespace) -> int:
    from verl_cluster.diagnostics.cluster_facts import cluster_bus
    from verl_cluster.submit.data_lengths import gather_lengths
    from verl_cluster.jobs.request import merge_overrides
    from verl_cluster.submit.job_input import JobInput
    from verl_cluster.config.job import job_factors_path
    from verl_cluster.placement.factors import apply_factors, factors_note, read_factors
    from verl_cluster.placement.length_plans import plan_lengths

    if getattr(args, "cluster", None):  # a file or a cluster name recorded here, as every command takes -c
        from verl_cluster.cli.cluster_args import by_word

        args.chosen = by_word(args.cluster)
        args.cluster = args.chosen.file
    # the same three forms as submit, key=value words before `--` included
    before = list(getattr(args, "before", None) or []) + model_config_word(args)
    job = JobInput.from_words(args.job, list(args.overrides or []), before).job()
    factors_file = getattr(args, "factors", None) or job_factors_path(job)
    factors = read_factors(factors_file) if factors_file else None  # bad input before the work
    from verl_cluster.placement.learned_host import stated

    stated(job)  # a bad placement.host_factor too
    facts = hardware(args, job.placement.gpus)
    spec = None
    if getattr(args, "cluster", None) and not args.data:  # the prompts measured on the head node, as submit does
        from verl_cluster.launchers import load_cluster

        spec = load_cluster(args.cluster)
    lengths, notes = gather_lengths(job, spec=spec, data=args.data, fill=args.fill)
    if not job.runs_verl:  # `-- python -m my_module --flag ...`: its words are its own, not verl's overrides
        program = job.entrypoint or " ".join(job.command)
        notes = [f"`{program}` is not verl's: its arguments go to it as given and the planner reads nothing from "
                 "them; this plan is of a verl PPO job with the job's fields alone (model, placement), and submit "
                 "applies none of it", *notes]
    # a live cluster's bus bandwidth as `check` last measured it (not when --gpus/--facts set the hardware)
    bus = cluster_bus(args.cluster) if getattr(args, "cluster", None) and not (args.gpus or args.facts) else ()
    plans = plan_lengths(job, facts, lengths, strategy=args.strategy, bus=bus)
    host_said = ""
    if factors is not None:  # both plans, so the one shown is still `plans.worst` or `plans.known`
        plans = replace(plans, worst=apply_factors(plans.worst, factors, factors_file),
                        known=apply_factors(plans.known, factors, factors_file))
    else:  # the host's speed placement.host_factor gives: earlier runs' on these machines (auto), or stated
        from verl_cluster.submit.integrations import with_host_factor

        (worst, known), host_said = with_host_factor(job, facts, plans.worst, plans.known)
        plans = replace(plans, worst=worst, known=known)
    # --fill asks what the plan is at that fill; otherwise the plan submit would run
    result = plans.known if args.fill is not None and plans.known is not None else plans.chosen
    not_applied = merge_overrides(job, result.overrides)[1]
    if args.json:
        print_json({**result.to_dict(), "verdict": plans.verdict,
                    "not_applied": [{"key": n.key, "value": n.value, "reason": n.reason} for n in not_applied]})
    else:
        from verl_cluster.placement.render import render

        render(result, out, brief=args.brief, lengths=plans)
        if factors is not None and args.brief:  # the full output has it under the step time
            said = [n for n in [*((result.time or {}).get("notes") or []), *result.reasons]
                    if n.startswith("factors from")]  # apply_factors's own: it knew whether the host factor took
            notes = [*notes, *(said[:1] or [factors_note(factors, factors_file)])]
        elif host_said and args.brief:
            notes = [*notes, host_said]
        for n in notes:
            err.print(f"[dim]note: {escape(n)}[/]")
        print_not_applied(not_applied)
        if not result.feasible:
            err.print("[bold red]error:[/] the job does not fit this hardware as written"
                      + (" (feasible changes above)" if result.options else " (numbers above)"))
    return EXIT_OK if result.feasible else EXIT_UNHEALTHY


def print_not_applied(items) -> None:
    """The planner's suggestions the job's own settings beat (the user's keys always win)."""
    if items:
        out.print(f"[bold]not applied[/] ({len(items)} planner suggestion{'s' if len(items) > 1 else ''}; "
                  "your settings win)")
    for n in items:
        out.print(f"  {escape(n.line())}")


assert EXIT_BAD_INPUT == 2  # documented exit codes: 0 fits, 1 does not fit, 2 bad input
