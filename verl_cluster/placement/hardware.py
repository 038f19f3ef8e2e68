"""Hardware as the planner sees it: NodeFacts reduced to one node type, checked the way verl needs it."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Optional

from verl_cluster.errors import PlanError
from verl_cluster.facts.measured_bus import BusMeasure
from verl_cluster.facts.model import NodeFacts

BUS_MAX_AGE_S = 7 * 86400  # an older measurement may predate a network or driver change


@dataclass(frozen=True)
class NodeKind:
    """Nodes with the same GPU model and memory (mixed clusters have several kinds)."""
    gpu_name: str
    capacity_bytes: float
    sm: tuple[int, int]
    nodes: tuple[int, ...]  # node indices (positions in Hardware.hosts)

    @property
    def resource(self) -> str:
        """A Ray custom resource name for these nodes (cluster.yaml `resources:`), for pinning a verl pool."""
        return "gpu_kind_" + "".join(ch if ch.isalnum() else "_" for ch in self.gpu_name.lower()).strip("_") + \
            f"_{int(self.capacity_bytes / 2**30)}g"


@dataclass(frozen=True)
class Hardware:
    hosts: tuple[str, ...]  # GPU nodes used, in order (node index = position)
    gpus_per_node: int
    capacity_bytes: float  # smallest GPU's total memory
    gpu_name: str
    sm: tuple[int, int]  # smallest compute capability
    islands: tuple[tuple[tuple[int, ...], ...], ...]  # distinct P2P island layouts among the nodes
    flash_attn: Optional[bool]  # False: missing/broken on some node; None: unknown (hypothetical hardware)
    flash_attn_note: str
    host_mem_bytes: Optional[float]  # smallest node RAM, when known
    notes: tuple[str, ...] = ()
    kinds: tuple[NodeKind, ...] = ()  # largest GPU memory first; empty or one kind: every node alike
    # `check`'s NCCL all-reduce bus bandwidth on this cluster (None: the GPU catalog's link, INTER_NODE_GBS across
    # nodes), for groups within a node ("node") or across nodes ("network"), and where it comes from
    measured_bus_gbs: Optional[float] = None
    measured_bus_scope: str = ""
    measured_bus_note: str = ""

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def total_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    def with_nodes(self, nnodes: int) -> "Hardware":
        """The same node type, `nnodes` of it (for "what would fit" suggestions)."""
        return Hardware(tuple(f"node{i}" for i in range(nnodes)), self.gpus_per_node, self.capacity_bytes,
                        self.gpu_name, self.sm, self.islands, self.flash_attn, self.flash_attn_note,
                        self.host_mem_bytes, self.notes, measured_bus_gbs=self.measured_bus_gbs,
                        measured_bus_scope=self.measured_bus_scope, measured_bus_note=self.measured_bus_note)

    def tp_crosses_islands(self, tp: int, gpu_indices: tuple[int, ...]) -> bool:
        """verl/vLLM form TP groups from consecutive ranks: GPUs [0..tp-1], [tp..2tp-1], ... of a pool on a
        node. True if any such group spans two P2P islands (NCCL then goes through host memory/PCIe)."""
        for layout in self.islands:
            where = {g: i for i, isl in enumerate(layout) for g in isl}
            for start in range(0, len(gpu_indices), tp):
                group = gpu_indices[start:start + tp]
                if len({where.get(g, -1 - g) for g in group}) > 1:
                    return True
        return False


def with_bus(hw: Hardware, measures: tuple[BusMeasure, ...], now: Optional[float] = None) -> Hardware:
    """The hardware with `check`'s recorded NCCL bus bandwidth of this cluster, when there is a recent one. Only
    NCCL on GPUs says anything about FSDP traffic: a gloo (CPU) figure is never used; an old one is named and left."""
    now = time.time() if now is None else now
    nccl = max((m for m in measures if m.backend == "nccl"), key=lambda m: m.measured_at, default=None)
    if nccl is None:
        if any(m.backend == "gloo" for m in measures):
            return replace(hw, notes=hw.notes + ("check measured gloo (CPU) all-reduce only: not used for FSDP "
                                                 "traffic, which NCCL carries between GPUs",))
        return hw
    age = now - nccl.measured_at
    if age > BUS_MAX_AGE_S:
        return replace(hw, notes=hw.notes + (f"check's NCCL bus bandwidth ({nccl.busbw_gbs:.1f} GB/s, {nccl.when()} "
                                             f"UTC) is {age / 86400:.0f} days old: not used; run `verl-cluster "
                                             "check` again to measure",))
    return replace(hw, measured_bus_gbs=nccl.busbw_gbs, measured_bus_scope=nccl.scope,
                   measured_bus_note=nccl.source())


def flash_status(nodes: list[NodeFacts]) -> tuple[Optional[bool], str]:
    for nf in nodes:
        err = nf.import_errors.get("flash_attn") or nf.import_errors.get("flash-attn")
        if err:
            return False, f"flash-attn is broken on {nf.host} ({err.splitlines()[0][:120]})"
        if nf.versions and "torch" in nf.versions and not nf.versions.get("flash_attn"):
            return False, f"flash-attn is not installed on {nf.host}"
    if any(nf.versions.get("flash_attn") for nf in nodes):
        return True, "flash-attn importable on every node"
    return None, "flash-attn assumed installed (no package facts for these nodes)"


def hardware_from_facts(facts: list[NodeFacts], *, nnodes: Optional[int] = None,
                        n_gpus_per_node: Optional[int] = None) -> Hardware:
    """Check the nodes the way verl's resource pool needs them and reduce them to one node type.
    `nnodes` / `n_gpus_per_node`: the job's trainer.* pins (use a subset of what is there)."""
    if not facts:
        raise PlanError("no nodes in the hardware facts", "pass --gpus 1x8xH100-80GB or --facts FILE.json")
    gpu_nodes = [nf for nf in facts if nf.gpus]
    notes = []
    if len(gpu_nodes) < len(facts):
        cpu_only = [nf.host for nf in facts if not nf.gpus]
        notes.append(f"nodes without GPUs are left out of the pools: {', '.join(cpu_only)}")
    if not gpu_nodes:
        why = next((nf.nvml_error for nf in facts if nf.nvml_error), None)
        raise PlanError("no GPUs in the hardware facts" + (f" ({why})" if why else ""),
                        "plan for hypothetical hardware with --gpus 1x8xH100-80GB")
    counts = sorted({len(nf.gpus) for nf in gpu_nodes})
    if n_gpus_per_node is None and len(counts) > 1:
        detail = ", ".join(f"{nf.host}: {len(nf.gpus)}" for nf in gpu_nodes)
        raise PlanError(
            f"nodes have different GPU counts ({detail}); verl's global_pool is [n_gpus_per_node] * nnodes with "
            "one STRICT_PACK placement group per node, so heterogeneous nodes are unsupported and a short node "
            "makes the placement group wait forever",
            f"set trainer.n_gpus_per_node={counts[0]} (use {counts[0]} GPUs on every node) or plan only the "
            f"{counts[-1]}-GPU nodes with trainer.nnodes")
    per_node = n_gpus_per_node or counts[0]
    usable = [nf for nf in gpu_nodes if len(nf.gpus) >= per_node]
    if n_gpus_per_node is not None and len(usable) < len(gpu_nodes):
        notes.append(f"trainer.n_gpus_per_node={per_node}: nodes with fewer GPUs are not used")
    want = nnodes or len(usable)
    if want > len(usable) or not usable:
        counts_text = ", ".join(f"{nf.host}: {len(nf.gpus)}" for nf in gpu_nodes)
        if nnodes is not None:
            pins = f"the job pins trainer.nnodes={nnodes}"
            pins += f" x trainer.n_gpus_per_node={n_gpus_per_node}" if n_gpus_per_node is not None else ""
        else:  # only the GPU count is pinned: nnodes would be every node that has that many GPUs
            pins = (f"the job pins trainer.n_gpus_per_node={per_node} (trainer.nnodes is not pinned; "
                    f"{len(gpu_nodes)} node(s) with GPUs here)")
        hint = ("lower trainer.nnodes / trainer.n_gpus_per_node or add nodes" if nnodes is not None else
                f"set trainer.n_gpus_per_node ≤ {counts[-1]} or add nodes with {per_node} GPUs")
        raise PlanError(f"{pins}, but only {len(usable)} node(s) have {per_node} GPUs ({counts_text}); "
                        "Ray would wait forever for the placement group", hint)
    used = usable[:want]
    gpus = [g for nf in used for g in nf.gpus[:per_node]]
    cap = min(g.memory_total_mib for g in gpus) * 2**20
    smallest = min(gpus, key=lambda g: g.memory_total_mib)
    kinds = node_kinds(used, per_node)
    if len(kinds) > 1:
        notes.append(f"mixed GPU kinds ({', '.join(f'{len(k.nodes)} node(s) of {k.gpu_name}' for k in kinds)}): "
                     f"verl's global_pool puts every role on every node, so it is planned for the smallest "
                     f"({smallest.name}); strategy split-nodes gives the actor and rollout the larger GPUs "
                     "(an entrypoint that builds pools, pinned by Ray resources)")
    busy = [f"{nf.host}:{g.index}" for nf in used for g in nf.gpus[:per_node]
            if g.memory_free_mib is not None and g.memory_free_mib < 0.9 * g.memory_total_mib]
    if busy:
        notes.append(f"GPUs already have memory in use ({', '.join(busy[:8])}{'...' if len(busy) > 8 else ''}): "
                     "the plan assumes empty GPUs")
    layouts = {}
    for nf in used:
        key = (len(nf.gpus), tuple((p.a, p.b, p.p2p) for p in nf.gpu_pairs))
        if key not in layouts:
            layouts[key] = tuple(tuple(i) for i in nf.p2p_islands())
    flash, note = flash_status(used)
    mems = [nf.mem_total_mib for nf in used]
    host_mem = min(mems) * 2**20 if mems and all(m for m in mems) else None
    return Hardware(
        hosts=tuple(nf.host for nf in used), gpus_per_node=per_node, capacity_bytes=float(cap),
        gpu_name=smallest.name, sm=min(g.sm for g in gpus), islands=tuple(layouts.values()),
        flash_attn=flash, flash_attn_note=note, host_mem_bytes=host_mem, notes=tuple(notes),
        kinds=kinds if len(kinds) > 1 else (),
    )


def node_kinds(nodes: list[NodeFacts], per_node: int) -> tuple[NodeKind, ...]:
    """Group nodes by their smallest GPU (model and memory), largest memory first."""
    groups: dict[tuple[str, int], list[int]] = {}
    sms: dict[tuple[str, int], tuple[int, int]] = {}
    for i, nf in enumerate(nodes):
        g = min(nf.gpus[:per_node], key=lambda x: x.memory_total_mib)
        key = (g.name, g.memory_total_mib)
        groups.setdefault(key, []).append(i)
        sms[key] = min(sms.get(key, g.sm), min(x.sm for x in nf.gpus[:per_node]))
    kinds = [NodeKind(name, mib * 2**20, sms[(name, mib)], tuple(idx)) for (name, mib), idx in groups.items()]
    return tuple(sorted(kinds, key=lambda k: (-k.capacity_bytes, k.nodes)))
