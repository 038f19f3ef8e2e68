"""Host RAM of one node running verl: what `psutil.virtual_memory().used` (verl's `perf/cpu_memory_used_gb`) shows.

Parts (per node; docs/placement.md, "Host memory", has the sources; the sampler's per-process PSS shows them):
- the node's own processes: OS, Ray (GCS, raylet, dashboard), the job driver, verl's TaskRunner and the Ray actors
  verl 0.9 starts whatever the model (8 agent-loop workers, 8 reward-loop workers, the load balancer): each imports
  torch and transformers, ~17 GiB of PSS on every recorded run, 0.5B to 3B;
- per GPU: the trainer worker (less its pinned buffers) and vLLM's server, engine and worker processes;
- host-resident states, held in pinned (shared) memory: the ref's params under verl's forced CPUOffload, and the
  offloaded params and Adam states; the rollout's weights while it sleeps leave no trace on the host (measured);
- at a checkpoint save, what verl 0.9.1's save path holds on the CPU (transient): FSDP1 on one GPU runs NO_SHARD,
  whose state dict is a full clone on the GPU, and torch.save streams each tensor through a CPU copy: the largest
  tensor (the embedding) in fp32; FSDP1 on N GPUs copies the whole model shard (4·P/N, + the root unit's gathered
  shard) to the CPU and holds it through the optimizer's save (whose states are saved from the GPU, by reference);
  FSDP2 streams its GPU shards (the largest one in fp32). Actor and critic save one after the other: the larger
  counts. Measured: +0.55 GiB for PPO 0.5B on one H100 (4 B x the 136M-param embedding = 0.51 GiB);
- the step's batch (DataProto) in the driver and in Ray's object store (shared memory, counted by the OOM killer).
The fitted constants come from scripts/calibration/fit_plan_calibration.py (the runs tagged host "fit" in
tests/fixtures/verl_runs/calibration_runs.json).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_cluster.placement.memory import GIB, Part, total
from verl_cluster.placement.planner import Strategy

if TYPE_CHECKING:
    from verl_cluster.placement.model_shape import ModelShape
    from verl_cluster.placement.planner import Candidate
    from verl_cluster.placement.settings import Settings

# Per GPU: PSS of the trainer worker less its shared (pinned) memory + vLLM's three processes at verl's step lines,
# mean over the fit runs that sampled it (fit_plan_calibration.py prints it); the node's part is then fitted.
PER_GPU_PROCESS_BYTES = 6.32 * GIB
NODE_BYTES = 17.1 * GIB  # fitted: node used RAM with no GPU processes and no host states
# A node that runs no driver: its raylet, agents and idle workers. verl's TaskRunner, agent-loop and reward-loop
# actors are started once per job, whatever the node count (the fit's NODE_BYTES holds them). Measured: 2.2 GiB PSS
# of Ray's processes for a head and a worker at rest (2x H200 namespace hosts, 2026-11-28), half each.
WORKER_NODE_BYTES = 1.1 * GIB
WORKER_PART = "node processes (Ray's raylet, agents, idle workers)"
REF_HOST_COPIES = 3.42  # fitted: host bytes per byte of ref params (fp32 master dtype) on the host
OFFLOAD_HOST_COPIES = 1.29  # fitted: host bytes per byte of offloaded params + Adam states
BATCH_BYTES_PER_TOKEN = 80  # DataProto: ids, masks, positions (int64), log-probs, values, advantages, rewards
BATCH_COPIES = 2  # the driver's batch and its copy in the object store while workers read it
HOST_STATE_FACTOR = {"ref": "REF_HOST_COPIES", "reward": "REF_HOST_COPIES", "actor": "OFFLOAD_HOST_COPIES",
                     "critic": "OFFLOAD_HOST_COPIES"}  # the rollout's asleep weights: not on the host
CHECKPOINT_PART = "checkpoint save (fp32 copies on the CPU)"


def _gpus(c: "Candidate") -> int:
    if c.strategy == Strategy.SPLIT_NODES:
        return max((len(p.gpu_indices) for p in c.pools), default=0)
    return sum(len(p.gpu_indices) for p in c.pools)


def _busiest_pools(c: "Candidate") -> list:
    return [p for p in c.pools if c.strategy != Strategy.SPLIT_NODES or p is c.pools[0]]


def host_terms(c: "Candidate") -> dict[str, float]:
    """The node's steady RAM as fitted constant -> coefficient (bytes, or bytes of states per copy factor)."""
    out = {"NODE_BYTES": 1.0, "PER_GPU_PROCESS_BYTES": float(_gpus(c)), "REF_HOST_COPIES": 0.0,
           "OFFLOAD_HOST_COPIES": 0.0}
    for pool in _busiest_pools(c):
        for r in pool.roles:
            if r in HOST_STATE_FACTOR:
                out[HOST_STATE_FACTOR[r]] += total(c.host.get(r, ())) * len(pool.gpu_indices)
    return out


def host_parts(c: "Candidate", s: "Settings", shape: "ModelShape") -> tuple[Part, ...]:
    """Host RAM of the busiest node (the head: it runs the driver too), by part, at its peak (a checkpoint save)."""
    t = host_terms(c)
    ckpt = 0.0
    for pool in _busiest_pools(c):
        trained = [r for r in pool.roles if r in ("actor", "critic")]
        if trained and s.save_freq > 0 and not s.lora_rank:
            ckpt += max(save_copy_bytes(shape, r, pool.size, s.fsdp2) for r in trained) * len(pool.gpu_indices)
    batch = s.sequences * s.seq_len * BATCH_BYTES_PER_TOKEN * BATCH_COPIES
    parts = [Part("node processes (OS, Ray, driver, verl's actors)", NODE_BYTES),
             Part("GPU worker processes (trainer + vLLM)", PER_GPU_PROCESS_BYTES * t["PER_GPU_PROCESS_BYTES"])]
    for name, b in (("ref params on host (pinned)", REF_HOST_COPIES * t["REF_HOST_COPIES"]),
                    ("offloaded params/Adam (pinned)", OFFLOAD_HOST_COPIES * t["OFFLOAD_HOST_COPIES"]),
                    ("batch (driver + object store)", batch), (CHECKPOINT_PART, ckpt)):
        if b:  # shown only when the job has it
            parts.append(Part(name, b))
    return tuple(parts)


def save_copy_bytes(shape: "ModelShape", role: str, n: int, fsdp2: bool) -> float:
    """Host bytes one trainer process holds at the peak of a checkpoint save (fp32), by verl 0.9.1's save path."""
    params = shape.params if role == "actor" else shape.value_model_params
    root = shape.root_params if role == "actor" else shape.value_root_params
    largest = shape.embed_params  # the embedding (an untied lm_head is as large)
    if fsdp2 or n == 1:  # streamed tensor by tensor (FSDP2 shards; NO_SHARD's full GPU clone)
        return 4.0 * largest / n
    return 4.0 * (params + root) / n  # FSDP1 sharded state dict: the model shard on the CPU, + the root gathered


def worker_parts(parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """Host RAM of a node other than the head, between saves: the head's parts less what runs once per job (the
    driver's processes and the step's batch), its Ray daemons instead."""
    out = [Part(WORKER_PART, WORKER_NODE_BYTES)]
    out += [p for p in parts if not p.name.startswith("node processes") and not p.name.startswith("batch")
            and p.name != CHECKPOINT_PART]
    return tuple(out)


def steady_bytes(parts: tuple[Part, ...]) -> float:
    """Between checkpoint saves: what verl's perf/cpu_memory_used_gb (logged in the actor update) is held against."""
    return total(tuple(p for p in parts if p.name != CHECKPOINT_PART))


def host_per_node(c: "Candidate", s: "Settings", shape: "ModelShape") -> float:
    return total(host_parts(c, s, shape))
