"""A CPU trainer that behaves like verl where `watch` cares: a Ray job that takes a step every ~1 s, runs a task on
every node each step, saves `global_step_N` under `trainer.default_local_dir` every `trainer.save_freq` steps and,
with `trainer.resume_mode=auto`, resumes after the newest one. Prints `step N` per step.

Arguments are verl-style `key=value` words:
  trainer.total_training_steps=10 trainer.save_freq=2 trainer.default_local_dir=/shared/ckpt
  trainer.resume_mode=auto|disable  resumable.step_s=1.0
Fault knobs (for tests): resumable.raise_at=N (ValueError at step N), resumable.hang_at=N (stops printing, once per
checkpoint folder), resumable.die_at=N (the process exits 1 at step N, every attempt), resumable.oom_at=N (fails at
step N with CUDA's out-of-memory message, once per checkpoint folder).
Every finished step is appended to `<default_local_dir>/steps.log` as `<ray job id> <step>`.
With resumable.rank_files=1 it saves and loads as verl's FSDP checkpoint manager does, one rank per node: each
`global_step_N/actor/` holds `model_world_size_{W}_rank_{r}.pt` (a DTensor, Shard(0) of a tensor made from N) and
`extra_state_world_size_{W}_rank_{r}.pt` for the W nodes alive, and `fsdp_config.json`; a resumed run opens the
files of its own world size (FileNotFoundError without them, as verl) and checks the tensor they hold.
"""

import os
import re
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def parse_args(argv):
    out = {}
    for a in argv:
        k, sep, v = a.partition("=")
        if sep:
            out[k.lstrip("+")] = v
    return out


class OutOfMemoryError(RuntimeError):
    """What torch raises when a GPU runs out of memory (torch.OutOfMemoryError), for the fault knob."""


@ray.remote(num_cpus=0, max_retries=0)
def work(step):
    return ray.util.get_node_ip_address(), step


@ray.remote(num_cpus=0, max_retries=0)
def node_env():
    keys = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    return ray.util.get_node_ip_address(), " ".join(f"{k}={os.environ.get(k, '-')}" for k in keys)


def newest_checkpoint(folder):
    steps = [int(m.group(1)) for n in os.listdir(folder) if (m := re.fullmatch(r"global_step_(\d+)", n))]
    return max(steps, default=0)


ROWS = 10  # not divisible by 3 or 4: uneven pieces, as FSDP's chunks are


def weights(step):
    import torch

    return torch.arange(ROWS * 4, dtype=torch.float32).reshape(ROWS, 4) + step


def save_rank_file(actor, step, world, r):
    """What verl's manager writes for rank `r` of `world` (its model shard as a DTensor, its extra state)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    full = weights(step)
    size = -(-ROWS // world)
    os.makedirs(actor, exist_ok=True)
    mesh = DeviceMesh("cpu", torch.arange(world), mesh_dim_names=("fsdp",), _init_backend=False, _rank=r)
    spec = DTensorSpec(mesh, (Shard(0),), TensorMeta(full.shape, full.stride(), full.dtype))
    local = full[min(r * size, ROWS):min((r + 1) * size, ROWS)].clone()
    torch.save({"w": DTensor(local, spec, requires_grad=False)},
               os.path.join(actor, f"model_world_size_{world}_rank_{r}.pt"))
    torch.save({"lr_scheduler": {"last_epoch": step}, "rng": {"cpu": torch.get_rng_state()}},
               os.path.join(actor, f"extra_state_world_size_{world}_rank_{r}.pt"))


@ray.remote(num_cpus=0, max_retries=0)
def save_on_node(actor, step, world, r):
    save_rank_file(actor, step, world, r)


def save_rank_files(actor, step, world, nodes=None):
    """Each rank's files written on its own node (`nodes`: Ray node ids, rank order), as verl's ranks do — a
    node-local folder then holds only that node's — or all here; fsdp_config.json by the driver."""
    import json

    if nodes:
        ray.get([save_on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[r], soft=False))
                 .remote(actor, step, world, r) for r in range(world)], timeout=60)
    else:
        for r in range(world):
            save_rank_file(actor, step, world, r)
    os.makedirs(actor, exist_ok=True)
    with open(os.path.join(actor, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world}, f)


def load_rank_files(actor, step, world):
    """Open the files of this world size, as verl does, and check the tensor their pieces make."""
    import torch

    pieces = [torch.load(os.path.join(actor, f"model_world_size_{world}_rank_{r}.pt"), weights_only=False)["w"]
              for r in range(world)]
    for r in range(world):
        torch.load(os.path.join(actor, f"extra_state_world_size_{world}_rank_{r}.pt"), weights_only=False)
    if not torch.equal(torch.cat([p.to_local() for p in pieces]), weights(step)):
        raise ValueError(f"{actor}: the rank files for world size {world} do not hold step {step}'s tensor")
    print(f"loaded {actor} on world size {world}: every piece equal", flush=True)


def save(folder, step, nodes=None, world=0):
    path = os.path.join(folder, f"global_step_{step}")
    os.makedirs(path, exist_ok=True)
    if nodes or world:
        save_rank_files(os.path.join(path, "actor"), step, len(nodes) if nodes else world, nodes)
    with open(os.path.join(path, "state.txt"), "w") as f:
        f.write(f"{step}\n")
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(f"{step}\n")
    print(f"local_global_step_folder: {path}", flush=True)


def main() -> int:
    args = parse_args(sys.argv[1:])
    total = int(args.get("trainer.total_training_steps", 10))
    save_freq = int(args.get("trainer.save_freq", 2))
    folder = args.get("trainer.default_local_dir", "checkpoints")
    resume = args.get("trainer.resume_mode", "disable")
    step_s = float(args.get("resumable.step_s", 1.0))
    rank_files = args.get("resumable.rank_files", "0") not in ("0", "", "false")
    raise_at, hang_at, die_at, oom_at = (int(args.get(f"resumable.{k}", 0))
                                         for k in ("raise_at", "hang_at", "die_at", "oom_at"))
    os.makedirs(folder, exist_ok=True)
    print("starting", flush=True)
    ray.init(address="auto", logging_level="ERROR")
    job_id = ray.get_runtime_context().get_job_id()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    print(f"nodes {len(nodes)}", flush=True)
    want = int(args.get("trainer.nnodes", 0) or 0)
    if want > len(nodes):  # verl's one placement group per node would wait for the missing one forever
        print(f"error: trainer.nnodes={want} but {len(nodes)} node(s) alive: the placement group cannot be placed",
              flush=True)
        return 1
    # the backend environment each node's Ray gives its workers (what `up` set: NCCL/Gloo interface)
    for ip, env in ray.get([node_env.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                            .remote() for n in nodes], timeout=60):
        print(f"env {ip} {env}", flush=True)
    start = newest_checkpoint(folder) if resume == "auto" else 0
    if start:  # verl's own words, which `watch` reads
        print(f"Resuming from {os.path.join(folder, f'global_step_{start}')}, setting global step to {start}",
              flush=True)
        if rank_files:
            load_rank_files(os.path.join(folder, f"global_step_{start}", "actor"), start, len(nodes))
    elif resume == "auto":
        print("Training from scratch", flush=True)
    for step in range(start + 1, total + 1):
        t0 = time.monotonic()
        if step == raise_at:
            raise ValueError(f"bad value at step {step}")
        if step == die_at:
            print(f"dying at step {step}", flush=True)
            os._exit(1)
        if step == oom_at and not os.path.exists(os.path.join(folder, ".oom")):
            open(os.path.join(folder, ".oom"), "w").close()
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                   "79.19 GiB of which 1.06 GiB is free.")
        if step == hang_at and not os.path.exists(os.path.join(folder, ".hung")):
            open(os.path.join(folder, ".hung"), "w").close()
            print(f"hanging at step {step}", flush=True)
            time.sleep(10**6)
        refs = [work.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(step)
                for n in nodes]
        ray.get(refs, timeout=60)  # a node that died fails the step, as a lost rank fails verl's
        with open(os.path.join(folder, "steps.log"), "a") as f:
            f.write(f"{job_id} {step}\n")
        print(f"step {step}", flush=True)
        if step % save_freq == 0 or step == total:
            save(folder, step, nodes if rank_files else None)
        time.sleep(max(0.0, step_s - (time.monotonic() - t0)))
    print(f"done: {total} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
