"""Hypothetical hardware: `--gpus NODESxGPUSxMODEL` -> NodeFacts, so the planner has one input type.

Forms: `2x8xH100-80GB`, `1x8xRTX4090-24GB`, `8xH100` (one node), `1x1xP40-24GB`, and a raw form
`1x2x48GB@8.9` (memory in GiB, compute capability; append `+p2p` or `+nvlink` for peer access).
Several groups can be joined with `,` (e.g. `1x8xH100-80GB,1x8xA100-80GB`) to describe mixed nodes.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from verl_cluster.errors import ConfigError
from verl_cluster.facts.model import GpuInfo, GpuPair, NodeFacts
from verl_cluster.placement.model_shape import CATALOG_DIR

GPU_EXAMPLE = "1x8xH100-80GB"


@dataclass(frozen=True)
class GpuModel:
    key: str  # catalog key, e.g. H100-80GB
    name: str  # what NVML would call it
    memory_mib: int
    sm: str
    p2p: bool
    nvlink: bool
    host_gib_per_gpu: Optional[float] = None  # host RAM of the typical server, per GPU (None: unknown)


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GpuModel]:
    data = json.loads((CATALOG_DIR / "gpus.json").read_text())
    return {
        k: GpuModel(k, v["name"], int(v["memory_mib"]), str(v["sm"]), bool(v["p2p"]), bool(v["nvlink"]),
                    v.get("host_gib_per_gpu"))
        for k, v in data.items()
        if not k.startswith("_")
    }


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def lookup_gpu(text: str) -> GpuModel:
    """Catalog key, case and punctuation ignored; a bare family name (`H100`) picks its only or first size."""
    cat = gpu_catalog()
    want = _norm(text)
    exact = [m for k, m in cat.items() if _norm(k) == want]
    if exact:
        return exact[0]
    family = [m for k, m in cat.items() if _norm(k.split("-")[0]) == want]
    if family:
        return family[0]
    near = difflib.get_close_matches(text.upper(), list(cat), n=1, cutoff=0.5)
    hint = f"did you mean `{near[0]}`?" if near else f"known: {', '.join(cat)}; or raw form like 1x2x48GB@8.9"
    raise ConfigError(f"--gpus: unknown GPU model `{text}`", hint)


_RAW = re.compile(r"^(?P<mem>\d+(?:\.\d+)?)\s*(?P<unit>GB|GIB|G|MB|MIB)@(?P<sm>\d+(?:\.\d+)?)(?P<link>\+(p2p|nvlink))?$", re.I)


def _parse_model(text: str) -> GpuModel:
    m = _RAW.match(text.strip())
    if not m:
        return lookup_gpu(text)
    mem = float(m["mem"])
    mib = int(mem * 1024) if m["unit"].upper() in ("GB", "GIB", "G") else int(mem)
    sm = m["sm"] if "." in m["sm"] else f"{m['sm']}.0"
    link = (m["link"] or "").lower()
    return GpuModel(text, f"GPU {mem:g} GiB sm_{sm}", mib, sm, bool(link), link == "+nvlink")


def parse_gpus(spec: str, host_mem_gib: Optional[float] = None) -> list[NodeFacts]:
    """`2x8xH100-80GB` -> two NodeFacts with 8 GpuInfo each and all-pairs topology from the catalog.
    Host RAM per node: `host_mem_gib`, else the catalog's typical server for that GPU (never this machine's)."""
    if host_mem_gib is not None and not host_mem_gib > 0:
        raise ConfigError(f"--host-mem: must be a positive number of GiB, got {host_mem_gib}", "e.g. --host-mem 1024")
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("--gpus: empty; expected NODESxGPUSxMODEL", f"e.g. {GPU_EXAMPLE}")
    nodes: list[NodeFacts] = []
    for group in spec.split(","):
        parts = [p.strip() for p in group.strip().split("x", 2)] if group.strip() else []
        if len(parts) == 3 and not parts[1].isdigit():  # 8xH100-80GB... with an `x` inside the model: no
            parts = [parts[0], "x".join(parts[1:])]
        if len(parts) == 2:
            parts = ["1"] + parts  # GPUSxMODEL: one node
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            raise ConfigError(f"--gpus: `{group.strip()}` is not NODESxGPUSxMODEL", f"e.g. {GPU_EXAMPLE} or 1x2x48GB@8.9")
        n_nodes, n_gpus = int(parts[0]), int(parts[1])
        if not (1 <= n_nodes <= 100_000) or not (1 <= n_gpus <= 64):
            raise ConfigError(f"--gpus: `{group.strip()}`: need 1..100000 nodes and 1..64 GPUs per node")
        model = _parse_model(parts[2])
        if model.memory_mib < 1024:
            raise ConfigError(f"--gpus: `{parts[2]}`: under 1 GiB of GPU memory")
        for _ in range(n_nodes):
            nodes.append(node_facts(f"node{len(nodes)}", model, n_gpus, host_mem_gib))
    return nodes


@lru_cache(maxsize=64)
def _pairs(n_gpus: int, p2p: bool, nvlink: bool) -> tuple[GpuPair, ...]:
    anc = "internal" if nvlink else "system"
    return tuple(GpuPair(a, b, anc, p2p, nvlink) for a, b in itertools.combinations(range(n_gpus), 2))


def node_facts(host: str, model: GpuModel, n_gpus: int, host_mem_gib: Optional[float] = None) -> NodeFacts:
    gpus = [
        GpuInfo(index=i, name=model.name, memory_total_mib=model.memory_mib, compute_capability=model.sm,
                nvlink_links_active=18 if model.nvlink else 0)
        for i in range(n_gpus)
    ]
    ram = host_mem_gib if host_mem_gib is not None else (
        model.host_gib_per_gpu * n_gpus if model.host_gib_per_gpu else None)
    return NodeFacts(host=host, hostname=host, gpus=gpus, gpu_pairs=list(_pairs(n_gpus, model.p2p, model.nvlink)),
                     mem_total_mib=None if ram is None else int(ram * 1024))
