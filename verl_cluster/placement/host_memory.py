"""Host RAM of one node running verl: what `psutil.virtual_memory().used` (verl's `perf/cpu_memory_used_gb`) shows.

Parts (per node; docs/placement.md, "Host memory", has the sources and the fit):
- the node's own processes: OS, Ray (GCS, raylet, dashboard), the job driver and verl's TaskRunner — fitted;
- per GPU: the trainer worker (torch + CUDA + verl + transformers) and vLLM's processes — a prior, not measured
  apart from the node's part (every recorded run had one GPU);
- host-resident states (ref params under verl's forced CPUOffload, sleeping rollout weights, offloaded params and
  Adam states), each held in pinned buffers beside the CPU copies they were built from: bytes x HOST_COPIES, fitted;
- at a checkpoint save, each trainer process's shard of fp32 params + Adam states copied to the CPU (transient);
- the step's batch (DataProto) in the driver and in Ray's object store (shared memory, counted by the OOM killer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_cluster.placement.memory import GIB, Part, total
from verl_cluster.placement.planner import Strategy

if TYPE_CHECKING:
    from verl_cluster.placement.model_shape import ModelShape
    from verl_cluster.placement.planner import Candidate
    from verl_cluster.placement.settings import Settings

# Fitted on the two GRPO runs on one H100 (tiny and 0.5B shape; docs/BENCHMARKS.md "Host memory"): node used RAM
# = NODE + GPU x PER_GPU + HOST_COPIES x host states. The PPO 0.5B run is the hold-out.
NODE_AND_ONE_GPU_BYTES = 22.6 * GIB  # tiny GRPO run: no host states to speak of
PER_GPU_PROCESS_BYTES = 7.0 * GIB  # prior: trainer worker ~4 GiB + vLLM worker/engine ~3 GiB RSS (unmeasured split)
NODE_BYTES = NODE_AND_ONE_GPU_BYTES - PER_GPU_PROCESS_BYTES
HOST_COPIES = 2.6  # (29.75 - 22.6) GiB / 2.76 GiB of ref params + sleeping weights on the 0.5B GRPO run
CHECKPOINT_BYTES = 12  # per parameter / N: fp32 params + AdamW's two fp32 states, copied to the CPU to be saved
BATCH_BYTES_PER_TOKEN = 80  # DataProto: ids, masks, positions (int64), log-probs, values, advantages, rewards
BATCH_COPIES = 2  # the driver's batch and its copy in the object store while workers read it


def host_parts(c: "Candidate", s: "Settings", shape: "ModelShape") -> tuple[Part, ...]:
    """Host RAM of the busiest node (the head: it runs the driver too), by part, at its peak (a checkpoint save)."""
    gpus = max((len(p.gpu_indices) for p in c.pools), default=0) if c.strategy == Strategy.SPLIT_NODES else \
        sum(len(p.gpu_indices) for p in c.pools)
    states = 0.0
    ckpt = 0.0
    for pool in c.pools:
        if c.strategy == Strategy.SPLIT_NODES and pool is not c.pools[0]:
            continue
        per_gpu = sum(total(c.host.get(r, ())) for r in pool.roles)
        states += per_gpu * len(pool.gpu_indices)
        trained = [shape.params if r == "actor" else shape.value_model_params for r in pool.roles
                   if r in ("actor", "critic")]
        if s.save_freq > 0 and not s.lora_rank:
            ckpt += sum(CHECKPOINT_BYTES * p / pool.size for p in trained) * len(pool.gpu_indices)
    batch = s.sequences * s.seq_len * BATCH_BYTES_PER_TOKEN * BATCH_COPIES
    parts = [Part("node processes (OS, Ray, driver, TaskRunner)", NODE_BYTES),
             Part("GPU worker processes (trainer + vLLM)", PER_GPU_PROCESS_BYTES * gpus),
             Part("host states x copies (ref/offload/sleeping weights)", states * HOST_COPIES),
             Part("batch (driver + object store)", batch)]
    if ckpt:
        parts.append(Part(CHECKPOINT_PART, ckpt))
    return tuple(parts)


CHECKPOINT_PART = "checkpoint save (fp32 params + Adam to CPU)"


def steady_bytes(parts: tuple[Part, ...]) -> float:
    """Between checkpoint saves: what verl's perf/cpu_memory_used_gb (logged in the actor update) is held against."""
    return total(tuple(p for p in parts if p.name != CHECKPOINT_PART))


def host_per_node(c: "Candidate", s: "Settings", shape: "ModelShape") -> float:
    return total(host_parts(c, s, shape))
