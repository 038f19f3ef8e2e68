"""How fast this host runs verl's host side: the Python probe `doctor` records (probe_node.host_python_ms) and, with
torch on a GPU, a tiny kernel's launch and a `.item()` round trip (what a packed pass's layers wait on 5 times a
layer). One JSON line; run it with the Python verl runs in (the grid's chains run it at setup).

    python3 scripts/gpu/gpu_host_probe.py [--repeats 3]

Hosts reporting the same CPU model ran the same verl work ~1.4x apart (docs/placement.md, "Batch V"): the figures
here are what tells them apart."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verl_cluster.diagnostics.probe_node import cpu_info, host_python_ms  # noqa: E402


def gpu_latencies(launches: int = 2000, syncs: int = 500) -> dict:
    """Per launch of a one-element add (queued, not waited on) and per `.item()` of a one-element tensor (a launch,
    then the host waits for the GPU): the fastest of 5 rounds each, in µs."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None}
    x = torch.zeros(1, device="cuda")
    for _ in range(200):  # warm: the kernel loaded, the allocator's block cached
        x.add_(1)
    torch.cuda.synchronize()
    launch, sync = float("inf"), float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        launch = min(launch, (time.perf_counter() - t) / launches)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(syncs):
            x.add_(1).item()
        sync = min(sync, (time.perf_counter() - t) / syncs)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "launch_us": round(launch * 1e6, 2), "sync_us": round(sync * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="whole probes, one JSON line each")
    a = ap.parse_args(argv)
    for i in range(a.repeats):
        doc = {"probe": i, "t": round(time.time(), 1), "python": platform.python_version(),
               "host_python_ms": host_python_ms(), "cpu": cpu_info()}
        try:
            doc.update(gpu_latencies())
        except Exception as e:  # noqa: BLE001 - no torch, or CUDA failing: the Python probe alone, and why
            doc["gpu_error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
