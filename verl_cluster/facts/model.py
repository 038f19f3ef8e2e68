"""Facts about nodes, as data: gathered first (NVML, ip, ucx_info, versions), then planned on.

Everything here serialises to JSON and back (`to_json` / `from_json`) so recorded facts replay in tests.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str  # e.g. "NVIDIA H200"
    memory_total_mib: int
    memory_free_mib: Optional[int] = None
    compute_capability: str = "0.0"  # "9.0"
    uuid: str = ""
    nvlink_links_active: int = 0
    ecc_errors_uncorrected: Optional[int] = None
    processes: int = 0  # compute processes holding memory on it

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_mib / 1024

    @property
    def sm(self) -> tuple[int, int]:
        major, _, minor = self.compute_capability.partition(".")
        return int(major or 0), int(minor or 0)


@dataclass(frozen=True)
class GpuPair:
    """Topology between two GPUs of one node."""

    a: int
    b: int
    common_ancestor: str = "unknown"  # NVML: internal|single|multiple|hostbridge|node|system
    p2p: bool = False  # CUDA peer access possible (NVML P2P read status)
    nvlink: bool = False


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: list[str] = field(default_factory=list)  # "10.0.0.2/24"
    mtu: int = 0
    up: bool = True
    kind: str = ""  # loopback, ether, bridge, veth, docker, ib, ...


@dataclass(frozen=True)
class NodeFacts:
    host: str
    hostname: str = ""
    interfaces: list[Interface] = field(default_factory=list)
    route_to_head: Optional[str] = None  # interface name the kernel picks to reach the head
    rdma_devices: list[str] = field(default_factory=list)
    ucx_version: Optional[str] = None
    ucx_transports: list[str] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_pairs: list[GpuPair] = field(default_factory=list)
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None
    python_version: Optional[str] = None
    versions: dict[str, str] = field(default_factory=dict)  # torch, torch_cuda, nccl, flash_attn, verl, ray
    import_errors: dict[str, str] = field(default_factory=dict)  # package -> first line of its import error
    ulimit_nofile: Optional[int] = None
    mem_total_mib: Optional[int] = None
    swap_total_mib: Optional[int] = None
    cpu_count: Optional[int] = None
    # a fixed piece of Python work on this host, fastest of 7 runs (probe_node.host_python_ms): how fast verl's
    # host-bound phases can run here; comparable between hosts at the same python_version
    host_python_ms: Optional[float] = None
    # the CPU time the hypervisor gave away while that ran, % of all CPUs' time (a VM's neighbours; 0 on bare metal)
    host_steal_pct: Optional[float] = None
    clock_offset_s: Optional[float] = None
    nvml_error: Optional[str] = None  # why there are no GPU facts, if any
    # what the backend choice and `check` need beyond the GPUs
    route_source: Optional[str] = None  # source address the kernel uses towards the head
    rdma_active_ports: list[str] = field(default_factory=list)  # "mlx5_0:1" for ports in state ACTIVE
    python_executable: Optional[str] = None
    cuda_visible_devices: Optional[str] = None  # in the probe's environment (a Slurm step's GPUs, a user's shell)

    def p2p_islands(self) -> list[list[int]]:
        """GPU indices grouped so that every pair inside a group can peer (connected components)."""
        parent = {g.index: g.index for g in self.gpus}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for p in self.gpu_pairs:
            if p.p2p and p.a in parent and p.b in parent:
                parent[find(p.a)] = find(p.b)
        groups: dict[int, list[int]] = {}
        for i in sorted(parent):
            groups.setdefault(find(i), []).append(i)
        return list(groups.values())


# ---- JSON round trip for any of the dataclasses above ----

def to_dict(obj: Any) -> Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Rebuild a (nested) dataclass from plain data, ignoring unknown keys (newer recordings). A value of the wrong
    type, or a required field missing, is a ValueError naming the field's path (`gpus[0].memory_total_mib`)."""
    if not dataclasses.is_dataclass(cls):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{where or cls.__name__} must be an object, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        at = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{at} is missing")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], at)
    return cls(**kwargs)


_SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _convert(tp: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where) if inner else value
    if origin in (list, dict) and not isinstance(value, origin):
        raise ValueError(f"{where} must be {'a list' if origin is list else 'an object'}, got {_kind(value)}")
    if origin is list and args:
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp in _SCALARS:
        ok = isinstance(value, bool) if tp is bool else (
            isinstance(value, (int, float) if tp is float else tp) and not isinstance(value, bool))
        if not ok:
            raise ValueError(f"{where} must be {_SCALARS[tp]}, got {_kind(value)} {json.dumps(value)[:40]}")
    return value


def to_json(obj: Any, **kw: Any) -> str:
    return json.dumps(to_dict(obj), **kw)


def from_json(cls: type, text: str) -> Any:
    return from_dict(cls, json.loads(text))
