#!/usr/bin/env python3
"""NCCL busbw as `verl-cluster check` reports it vs a plain torch.distributed all_reduce loop, same sizes, same run.

    verl-cluster up cluster_configs/local.yaml
    python scripts/bench/bench_nccl.py cluster_configs/local.yaml --rounds 2 --out bench_nccl.json

`check` side: verl_cluster.diagnostics.collective.run_collective(..., "nccl", iters=20, warmup=5) - the exact call
`check` makes (Ray actors, one per GPU, the selected backend env). Plain side: one process per GPU
(torch.multiprocessing.spawn), init_process_group("nccl"), for each size `warmup` all_reduces then `iters` timed
ones between CUDA syncs and a barrier; time = the slowest rank's mean. busbw = size/time * 2(n-1)/n (nccl-tests).
The two alternate `--rounds` times; the best of each per size is compared. Target: check >= 0.95 x plain.

--across-nodes: the plain side runs one process per GPU on every node of the cluster file instead (through the
same SSH runners `check` uses, each with its node's `env` and the NIC/backend env `check` selected), rendezvous
on the head: the loop across the node boundary that `check` measures there.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SIZES = [1 << 20, 64 << 20, 1 << 30]
TARGET = 0.95


def _plain_worker(rank, world, port, sizes, iters, warmup, out_path):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    res = []
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        for _ in range(warmup):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        x = torch.tensor([dt], dtype=torch.float64, device="cuda")
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        res.append({"size": size, "time_s": x.item()})
        del t
    if rank == 0:
        Path(out_path).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def plain_loop(world, sizes, iters, warmup):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        mp.spawn(_plain_worker, args=(world, port, sizes, iters, warmup, out), nprocs=world, join=True)
        rows = json.loads(Path(out).read_text())
    factor = 2 * (world - 1) / world
    return [{"size": r["size"], "time_us": r["time_s"] * 1e6, "algbw_gbs": r["size"] / r["time_s"] / 1e9,
             "busbw_gbs": r["size"] / r["time_s"] / 1e9 * factor} for r in rows]


# one rank of the plain loop on a node (shipped as `python -c`): the same timing as _plain_worker
PLAIN_RANK = r"""
import datetime, json, os, sys, time
cfg = json.loads(sys.argv[1])
os.environ.update(cfg["env"])
import torch, torch.distributed as dist
torch.cuda.set_device(cfg["local"])
dist.init_process_group("nccl", init_method=f"tcp://{cfg['master']}:{cfg['port']}", rank=cfg["rank"],
                        world_size=cfg["world"], timeout=datetime.timedelta(seconds=180),
                        device_id=torch.device("cuda", cfg["local"]))
res = []
for size in cfg["sizes"]:
    t = torch.ones(size // 4, dtype=torch.float32, device="cuda")
    for _ in range(cfg["warmup"]):
        dist.all_reduce(t)
    torch.cuda.synchronize(); dist.barrier()
    t0 = time.perf_counter()
    for _ in range(cfg["iters"]):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    x = torch.tensor([(time.perf_counter() - t0) / cfg["iters"]], dtype=torch.float64, device="cuda")
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    res.append({"size": size, "time_s": x.item()})
    del t
dist.barrier(); dist.destroy_process_group()
print("@@ROWS@@" + json.dumps(res), flush=True)
"""


def plain_across_nodes(cluster_file, sizes, iters, warmup):
    """The plain loop with one rank per GPU on every node (node order, head first); the rows of rank 0."""
    from concurrent.futures import ThreadPoolExecutor

    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.diagnostics import collective
    from verl_cluster.diagnostics.backend import select_backend
    from verl_cluster.diagnostics.gather import gather_facts, make_runners
    from verl_cluster.facts.model import NodeFacts

    spec = load_cluster(cluster_file)
    runners = make_runners(spec)
    facts = {h: f for h, f in gather_facts(spec, runners).items() if isinstance(f, NodeFacts)}
    choice = select_backend(spec, facts)
    ranks = []
    for _, node in spec.nodes():
        for local in range(node.gpus or 1):
            ranks.append((node, local))
    world = len(ranks)
    port = collective.collective_port(spec) - 1

    def one(rank):
        node, local = ranks[rank]
        cfg = {"env": {**node.env, **choice.env.get(node.host, {})}, "master": spec.head_ip, "port": port,
               "rank": rank, "world": world, "local": local, "sizes": sizes, "iters": iters, "warmup": warmup}
        r = runners[node.host].run([spec.python_executable(node), "-c", PLAIN_RANK, json.dumps(cfg)],
                                   env=cfg["env"], timeout=600)
        rows = [ln for ln in r.stdout.splitlines() if ln.startswith("@@ROWS@@")]
        if not rows:
            raise RuntimeError(f"plain rank {rank} on {node.host} failed: {r.stderr[-800:]}")
        return json.loads(rows[0][len("@@ROWS@@"):])

    with ThreadPoolExecutor(world) as ex:
        rows = list(ex.map(one, range(world)))[0]
    factor = 2 * (world - 1) / world
    return world, [{"size": r["size"], "time_us": r["time_s"] * 1e6, "algbw_gbs": r["size"] / r["time_s"] / 1e9,
                    "busbw_gbs": r["size"] / r["time_s"] / 1e9 * factor} for r in rows]


def check_collective(cluster_file, sizes):
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.diagnostics import collective
    from verl_cluster.diagnostics.backend import select_backend
    from verl_cluster.diagnostics.gather import gather_facts, make_runners
    from verl_cluster.facts.model import NodeFacts

    spec = load_cluster(cluster_file)
    runners = make_runners(spec)
    facts = {h: f for h, f in gather_facts(spec, runners).items() if isinstance(f, NodeFacts)}
    choice = select_backend(spec, facts)
    r = collective.run_collective(spec, runners, choice.env, "nccl", sizes=sizes, iters=20, warmup=5)
    if not r.ok:
        raise RuntimeError(f"check's NCCL all-reduce failed: {r.error}")
    return r.world, r.results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cluster", nargs="?", default="cluster_configs/local.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="plain loop: timed iterations (check uses 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="bench_nccl.json")
    ap.add_argument("--across-nodes", action="store_true",
                    help="plain loop: one rank per GPU on every node of the cluster file (not spawned here)")
    args = ap.parse_args()
    import torch

    world = torch.cuda.device_count()
    if world < 2 and not args.across_nodes:
        print(f"needs 2+ GPUs, {world} visible", file=sys.stderr)
        return 1
    best_check: dict[int, dict] = {}
    best_plain: dict[int, dict] = {}
    rounds = []
    for i in range(args.rounds):
        t0 = time.monotonic()
        if args.across_nodes:
            world, prows = plain_across_nodes(args.cluster, SIZES, args.iters, args.warmup)
        else:
            prows = plain_loop(world, SIZES, args.iters, args.warmup)
        t1 = time.monotonic()
        cw, crows = check_collective(args.cluster, SIZES)
        t2 = time.monotonic()
        rounds.append({"check": crows, "plain": prows, "check_s": round(t2 - t1, 2), "plain_s": round(t1 - t0, 2)})
        print(f"round {i + 1}: plain {t1 - t0:.1f} s, check's collective {t2 - t1:.1f} s", flush=True)
        for r in crows:
            if r["size"] not in best_check or r["busbw_gbs"] > best_check[r["size"]]["busbw_gbs"]:
                best_check[r["size"]] = r
        for r in prows:
            if r["size"] not in best_plain or r["busbw_gbs"] > best_plain[r["size"]]["busbw_gbs"]:
                best_plain[r["size"]] = r
    table = []
    for size in SIZES:
        c, p = best_check[size]["busbw_gbs"], best_plain[size]["busbw_gbs"]
        table.append({"size": size, "check_busbw_gbs": round(c, 2), "plain_busbw_gbs": round(p, 2),
                      "ratio": round(c / p, 3), "meets_target": c / p >= TARGET})
    print(f"{'size':>10} {'check busbw GB/s':>17} {'plain busbw GB/s':>17} {'ratio':>6}  target >= {TARGET}")
    for t in table:
        print(f"{t['size']:>10} {t['check_busbw_gbs']:>17.2f} {t['plain_busbw_gbs']:>17.2f} {t['ratio']:>6.3f}"
              f"  {'ok' if t['meets_target'] else 'BELOW'}")
    doc = {"world": world, "across_nodes": args.across_nodes, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "sizes": SIZES, "iters": args.iters,
           "warmup": args.warmup, "table": table, "rounds": rounds}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
