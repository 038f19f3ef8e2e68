"""The all-reduce bus bandwidth `check` measured on a cluster, kept with the cluster's state:
~/.verl-cluster/<cluster>/collective.json, one record per backend (nccl, gloo), the newest run's.

`plan -c` and `submit` read it back (placement/hardware.py with_bus decides what it may be used for).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

from verl_cluster.config.state_files import finite_time, read_state_json

STATE_ROOT = "~/.verl-cluster"
FILE_NAME = "collective.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a cluster name as a folder, never a path


@dataclass(frozen=True)
class BusMeasure:
    cluster: str
    backend: str  # nccl (GPUs) | gloo (CPU tensors, one rank per node)
    nodes: int  # nodes the group spanned
    ranks: int
    gpus: int  # GPUs in the group (0 for gloo)
    busbw_gbs: float  # bus bandwidth at the largest message size
    size_bytes: int  # that size
    measured_at: float  # unix time

    @property
    def scope(self) -> str:
        """"network": the group crossed nodes; "node": it ran on one node's GPUs."""
        return "network" if self.nodes > 1 else "node"

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.measured_at))

    def source(self) -> str:
        where = f"{self.nodes} nodes" if self.nodes > 1 else "one node"
        return (f"measured by check {self.when()} UTC ({self.backend.upper()} all-reduce bus bandwidth at "
                f"{self.size_bytes / 2**20:g} MiB, {where}, {self.gpus} GPUs)")


def state_file(cluster: str) -> Optional[Path]:
    if not _SAFE_NAME.match(cluster or ""):
        return None
    return Path(os.path.expanduser(STATE_ROOT)) / cluster / FILE_NAME


def measure_of(cluster: str, backend: str, nodes: int, ranks: int, results: list[dict],
               now: Optional[float] = None) -> Optional[BusMeasure]:
    """A measurement from a collective's per-size results (size, busbw_gbs), or None without a usable figure."""
    sized = [r for r in results if isinstance(r.get("size"), int) and isinstance(r.get("busbw_gbs"), (int, float))]
    if not sized or nodes < 1:
        return None
    top = max(sized, key=lambda r: r["size"])
    if not top["busbw_gbs"] > 0:
        return None
    return BusMeasure(cluster, backend, nodes, ranks, ranks if backend == "nccl" else 0, float(top["busbw_gbs"]),
                      top["size"], time.time() if now is None else now)


def record(m: BusMeasure) -> Optional[Path]:
    """Keep `m` as its backend's record; best effort: a read-only home only costs the next plan this figure."""
    path = state_file(m.cluster)
    if path is None:
        return None
    doc = {b.backend: asdict(b) for b in recorded(m.cluster)}
    doc[m.backend] = asdict(m)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        return None
    return path


def recorded(cluster: str) -> tuple[BusMeasure, ...]:
    """Every backend's record for this cluster (none: an empty tuple; a damaged file counts as none)."""
    path = state_file(cluster)
    doc = read_state_json(path, 2**20) if path is not None else None  # bounded; a FIFO or link counts as none
    names = {f.name for f in fields(BusMeasure)}
    out = []
    for rec in doc.values() if isinstance(doc, dict) else ():
        try:
            out.append(BusMeasure(**{k: rec[k] for k in names}))
        except (KeyError, TypeError):
            continue
    return tuple(m for m in out if m.cluster == cluster and _valid(m))


def _valid(m: BusMeasure) -> bool:
    nums = (m.nodes, m.ranks, m.gpus, m.busbw_gbs, m.size_bytes, m.measured_at)
    if m.backend not in ("nccl", "gloo") or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and math.isfinite(v) for v in nums):
        return False
    # a figure a real fabric can give (NVLink 5 is 1.8 TB/s a GPU), a time a clock can show
    return 0 < m.busbw_gbs <= 10_000 and m.nodes >= 1 and finite_time(m.measured_at) > 0
