"""Node-side Ray driver for the collective test; run on the head with the node's Python (needs ray; the
actors need torch). Shipped as source: `python -c SOURCE ARGS_JSON`.

gloo: one actor per alive node, all_reduce over CPU tensors on the selected interface (GLOO_SOCKET_IFNAME).
nccl: one actor per GPU, all_reduce on the GPU; busbw = algbw * 2(n-1)/n as nccl-tests defines it.
Each size: warm-up (whose result is checked), then `iters` timed all_reduces; time = slowest rank's mean.
"""

import json
import os
import sys
import time

MARK = "@@VC-JSON@@"


def member_class(ray):
    @ray.remote(num_cpus=0)
    class Member:
        def __init__(self, env):
            os.environ.update(env)  # before torch.distributed reads GLOO_/NCCL_ variables

        def node_ip(self):
            return ray.util.get_node_ip_address()

        def run(self, backend, rank, world, master, port, sizes, iters, warmup, timeout_s):
            import datetime

            import torch
            import torch.distributed as dist
            dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            dev = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
            sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
            out = []
            try:
                for size in sizes:
                    t = torch.ones(size // 4, dtype=torch.float32, device=dev)
                    dist.all_reduce(t)
                    sync()
                    correct = float(t[0].item()) == float(world) and float(t[-1].item()) == float(world)
                    t.zero_()
                    for _ in range(warmup):
                        dist.all_reduce(t)
                    sync()
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        dist.all_reduce(t)
                    sync()
                    out.append({"size": size, "time_s": (time.perf_counter() - t0) / iters, "correct": correct})
            finally:
                dist.destroy_process_group()
            return out

    return Member


def main(cfg):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=cfg["address"], _node_ip_address=cfg["node_ip"], logging_level="ERROR",
             log_to_driver=False, configure_logging=False)
    Member = member_class(ray)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    env_by_ip = cfg["env_by_ip"]
    actors = []
    if cfg["backend"] == "gloo":
        for n in nodes:
            ip = n["NodeManagerAddress"]
            actors.append(Member.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                          .remote(env_by_ip.get(ip, {})))
    else:
        for n in nodes:
            ip = n["NodeManagerAddress"]
            for _ in range(int(n.get("Resources", {}).get("GPU", 0))):
                actors.append(Member.options(num_gpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(
                    n["NodeID"], soft=False)).remote(env_by_ip.get(ip, {})))
    if len(actors) < 2:
        return {"ok": False, "error": f"need at least 2 {'nodes' if cfg['backend'] == 'gloo' else 'GPUs'}, "
                                      f"found {len(actors)}"}
    try:
        ips = ray.get([a.node_ip.remote() for a in actors], timeout=cfg["timeout_s"])
        # rank 0 (the rendezvous) is the head's actor when there is one
        order = sorted(range(len(actors)), key=lambda i: (ips[i] != cfg["node_ip"], i))
        actors = [actors[i] for i in order]
        ips = [ips[i] for i in order]
        world = len(actors)
        t0 = time.monotonic()
        refs = [a.run.remote(cfg["backend"], rank, world, ips[0], cfg["port"], cfg["sizes"], cfg["iters"],
                             cfg["warmup"], cfg["timeout_s"]) for rank, a in enumerate(actors)]
        per_rank = ray.get(refs, timeout=cfg["timeout_s"])
        elapsed = time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - reported as data
        msg = (str(e).strip().splitlines() or [type(e).__name__])
        return {"ok": False, "error": f"{type(e).__name__}: {' '.join(msg[-3:])[:600]}"}
    finally:
        for a in actors:
            ray.kill(a)
    results = []
    factor = 2 * (world - 1) / world
    for i, size in enumerate(cfg["sizes"]):
        t = max(r[i]["time_s"] for r in per_rank)
        algbw = size / t / 1e9
        results.append({"size": size, "time_us": t * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * factor,
                        "correct": all(r[i]["correct"] for r in per_rank)})
    return {"ok": all(r["correct"] for r in results), "backend": cfg["backend"], "world": world,
            "ips": ips, "results": results, "seconds": elapsed}


if __name__ == "__main__":
    try:
        result = main(json.loads(sys.argv[1]))
    except Exception as e:  # noqa: BLE001 - reported as data
        result = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:600]}"}
    print(MARK + json.dumps(result), flush=True)
