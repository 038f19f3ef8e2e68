#!/usr/bin/env python3
"""Time the planner on a large hypothetical cluster: `python scripts/bench/bench_plan.py [--gpus 1024x8xH100-80GB]`.
Target: < 1 s for 1024 nodes x 8 GPUs (parsing the hardware, the search, and the JSON document).
`--as-written`: the job's own batch (256/64 does not divide 8192 GPUs), so the time includes the search for
feasible changed plans (options.py)."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

from verl_cluster.config.job import ModelSpec, load_job
from verl_cluster.placement import parse_gpus, plan_job

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", default="1024x8xH100-80GB")
    ap.add_argument("--job", default=str(ROOT / "launch/gsm8k.yaml"))
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--as-written", action="store_true", help="keep the job's batch: plan, then search changes")
    args = ap.parse_args()
    job = load_job(args.job)
    job = replace(job, model=ModelSpec(catalog=args.model))
    if not args.as_written:
        job = replace(job, overrides={**job.overrides, "data.train_batch_size": 8192,
                                      "actor_rollout_ref.actor.ppo_mini_batch_size": 8192})
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        facts = parse_gpus(args.gpus)
        t1 = time.perf_counter()
        p = plan_job(job, facts)
        t2 = time.perf_counter()
        doc = json.dumps(p.to_dict())
        t3 = time.perf_counter()
        times.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    best = min(times, key=lambda t: t[3])
    med = statistics.median(t[3] for t in times)
    print(f"{args.gpus} {args.model}: feasible={p.feasible} strategy={p.strategy} TP={p.tp} offload={p.offload}"
          f" options={len(p.options)}" + (f" (1: {'; '.join(p.options[0].changes)})" if p.options else ""))
    print(f"parse {best[0]:.3f} s, plan {best[1]:.3f} s, json {best[2]:.3f} s ({len(doc) / 1e6:.1f} MB); "
          f"total best {best[3]:.3f} s, median {med:.3f} s over {args.repeat} ({platform.processor() or platform.machine()},"
          f" Python {platform.python_version()})")
    return 0 if best[3] < 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
