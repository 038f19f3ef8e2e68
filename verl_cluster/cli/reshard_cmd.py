"""`verl-cluster reshard CKPT_DIR --world-size M`: make a verl FSDP checkpoint (FSDP2 or FSDP1) loadable on M GPUs.

CKPT_DIR is trainer.default_local_dir (the step in latest_checkpointed_iteration.txt is used) or one
global_step_N folder. Every role (actor, critic) gets model, optimizer and extra-state files for M ranks, written
beside the existing ones (the step still resumes on the old world size), or, with --out, as a new checkpoint
root whose latest_checkpointed_iteration.txt is written last. Runs on CPU in ~0.4 GiB of memory, whatever the model.
Exit 0 done (or nothing to do), 2 a checkpoint this tool does not understand or bad arguments.
"""

from __future__ import annotations

import argparse

from rich.markup import escape

from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_OK


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("reshard", parents=[common], help="reshard a verl FSDP checkpoint to another number of GPUs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt_dir", metavar="CKPT_DIR", help="trainer.default_local_dir, or a global_step_N folder")
    p.add_argument("--world-size", type=int, required=True, metavar="M", help="GPUs the resumed run will have")
    p.add_argument("--step", type=int, help="which global_step_N (default: the tracker's, else the newest)")
    p.add_argument("--out", metavar="DIR", help="write a new checkpoint root here instead of adding files in place")
    p.add_argument("--fsdp-size", type=int, metavar="N",
                   help="the new run's actor.fsdp_config.fsdp_size when it shards over fewer ranks than M (HSDP)")
    p.add_argument("--from-world-size", type=int, metavar="W",
                   help="the world size to read when the step holds complete files for several")
    p.add_argument("--dry-run", action="store_true", help="list what would be read and written; change nothing")
    p.add_argument("--json", action="store_true", help="print the plan (and result) as JSON")
    p.set_defaults(func=run)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def run(args) -> int:
    from verl_cluster.reshard import apply_reshard, plan_reshard

    plan = plan_reshard(args.ckpt_dir, args.world_size, step=args.step, out_dir=args.out, fsdp_size=args.fsdp_size,
                        from_world_size=args.from_world_size)
    if args.dry_run:
        if args.json:
            print_json({"dry_run": True, "plan": plan.to_dict()})
        else:
            _print_plan(plan)
        return EXIT_OK
    if plan.nothing_to_do:
        if args.json:
            print_json({"dry_run": False, "plan": plan.to_dict(), "nothing_to_do": True})
        else:
            out.print(f"{escape(plan.step_dir)}: {plan.notes[0]}; nothing to do")
        return EXIT_OK
    progress = None if args.json else (lambda msg: err.print(f"  {escape(msg)}"))
    if not args.json:
        err.print(f"resharding global_step_{plan.step} ({', '.join(plan.roles)}) from {plan.from_world_size} to "
                  f"{plan.world_size} ranks: {_gib(plan.bytes_read)} to read")
    result = apply_reshard(plan, progress)
    if args.json:
        print_json(result.to_dict())
        return EXIT_OK
    where = f"{plan.out_dir}/global_step_{plan.step}" if plan.out_dir else plan.step_dir
    out.print(f"done: {escape(where)} loads on {plan.world_size} GPUs ({result.seconds:.1f} s, "
              f"{_gib(result.bytes_written)} of tensors written, peak memory {_gib(result.peak_anon_bytes)}; "
              f"largest tensor {escape(result.largest_tensor)} {_gib(result.largest_tensor_bytes)})")
    out.print("RNG: " + ", ".join(_rng_summary(result.rng)))
    for note in plan.notes:
        out.print(f"note: {escape(note)}")
    return EXIT_OK


def _rng_summary(lines: list[str]) -> list[str]:
    carried = sum(1 for s in lines if s.endswith(": carried"))
    reseeded = sum(1 for s in lines if ": re-seeded" in s)
    rest = [s for s in lines if not s.endswith(": carried") and ": re-seeded" not in s]
    return [f"{carried} extra-state files carried as saved", f"{reseeded} re-seeded (ranks that did not exist)"] + rest


def _print_plan(plan) -> None:
    if plan.nothing_to_do:
        out.print(f"{escape(plan.step_dir)}: {plan.notes[0]}; nothing to do")
        return
    out.print(f"global_step_{plan.step} ({', '.join(plan.roles)}): {plan.from_world_size} -> {plan.world_size} ranks"
              + (f", fsdp_size {plan.fsdp_size}" if plan.fsdp_size != plan.world_size else ""))
    out.print(f"read ({len(plan.reads)} files, {_gib(plan.bytes_read)}):")
    for p in plan.reads:
        out.print(f"  {escape(p)}")
    out.print(f"write (into {escape(plan.scratch)}, then "
              + ("renamed to the step folder, tracker written last" if plan.out_dir else
                 "renamed beside the existing files; fsdp_config.json switched last") + "):")
    for op in plan.ops:
        out.print(f"  {op.op:8} {escape(op.dest)}")
    for note in plan.notes:
        out.print(f"note: {escape(note)}")
