"""The GPUs of a node as Ray (and so verl) will use them, not as NVML lists them.

A node's `gpus:` in cluster.yaml (or the Slurm allocation's count) becomes `ray start --num-gpus N`, and a
`CUDA_VISIBLE_DEVICES` in its `env:` (or in the environment its commands start in: a Slurm step's GPUs) reaches the
raylet: Ray then hands out the first N visible devices, renumbered from 0 as CUDA does. NVML sees every GPU of the
machine, so facts are narrowed to that view before planning.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from verl_cluster.facts.model import GpuInfo, GpuPair, NodeFacts


def visible_indices(facts: NodeFacts, gpus: Optional[int], cuda_visible: Optional[str]) -> list[int]:
    """NVML indices of the GPUs Ray gets, in device order."""
    order = sorted(g.index for g in facts.gpus)
    if cuda_visible is not None and cuda_visible.strip() not in ("", "all"):
        by_uuid = {g.uuid: g.index for g in facts.gpus if g.uuid}
        picked = []
        for item in (x.strip() for x in cuda_visible.split(",")):
            if item.isdigit() and int(item) in order:
                picked.append(int(item))
            elif item in by_uuid:
                picked.append(by_uuid[item])
            else:
                break  # CUDA stops at the first entry it cannot resolve
        order = picked
    return order if gpus is None else order[:max(0, gpus)]


def as_ray_sees(facts: NodeFacts, gpus: Optional[int], env: Optional[dict] = None) -> NodeFacts:
    """`facts` with only the GPUs Ray gets on this node, renumbered 0.. in device order (pairs kept between them)."""
    # the node's configured env wins; else what the probe, started the way Ray is, found in its environment
    keep = visible_indices(facts, gpus, (env or {}).get("CUDA_VISIBLE_DEVICES", facts.cuda_visible_devices))
    if keep == sorted(g.index for g in facts.gpus):
        return facts
    new = {old: i for i, old in enumerate(keep)}
    by_index = {g.index: g for g in facts.gpus}
    kept: list[GpuInfo] = [replace(by_index[old], index=new[old]) for old in keep]
    pairs: list[GpuPair] = [replace(p, a=new[p.a], b=new[p.b]) for p in facts.gpu_pairs if p.a in new and p.b in new]
    return replace(facts, gpus=kept, gpu_pairs=pairs)
