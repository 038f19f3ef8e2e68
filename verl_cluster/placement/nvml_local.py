"""This machine's GPUs via NVML, for `plan` without --gpus/--facts. Deliberately tiny: the diagnostics
gatherer (verl_cluster.diagnostics) is the real fact source and may replace this."""

from __future__ import annotations

import socket
from typing import Any

from verl_cluster.facts.model import GpuInfo, GpuPair, NodeFacts


def local_node_facts() -> NodeFacts:
    """GPUs, memory, compute capability and P2P status of this host; `nvml_error` says why there are none."""
    host = socket.gethostname()
    try:
        import pynvml as nv  # nvidia-ml-py
    except ImportError as e:
        return NodeFacts(host=host, nvml_error=f"pynvml not importable: {e}")
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded on CPU machines
        return NodeFacts(host=host, nvml_error=f"NVML unavailable: {e}")
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        gpus = [_gpu(nv, i, h) for i, h in enumerate(handles)]
        pairs = []
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                pairs.append(GpuPair(a, b, p2p=_p2p(nv, handles[a], handles[b]), nvlink=gpus[a].nvlink_links_active > 0))
        return NodeFacts(host=host, hostname=host, gpus=gpus, gpu_pairs=pairs,
                         driver_version=_text(nv.nvmlSystemGetDriverVersion()))
    except Exception as e:
        return NodeFacts(host=host, nvml_error=f"NVML query failed: {e}")
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _gpu(nv: Any, i: int, h: Any) -> GpuInfo:
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
    links = 0
    for link in range(18):
        try:
            links += int(nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED)
        except Exception:
            break
    return GpuInfo(index=i, name=_text(nv.nvmlDeviceGetName(h)), memory_total_mib=mem.total // 2**20,
                   memory_free_mib=mem.free // 2**20, compute_capability=f"{major}.{minor}",
                   uuid=_text(nv.nvmlDeviceGetUUID(h)), nvlink_links_active=links)


def _p2p(nv: Any, a: Any, b: Any) -> bool:
    try:
        return nv.nvmlDeviceGetP2PStatus(a, b, nv.NVML_P2P_CAPS_INDEX_READ) == nv.NVML_P2P_STATUS_OK
    except Exception:
        return False
