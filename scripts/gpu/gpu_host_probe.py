"""How fast this host runs verl's host side: the Python probe `doctor` records (probe_node.host_python_ms) and, with
torch on a GPU, a tiny kernel's launch and a `.item()` round trip (what a packed pass's layers wait on 5 times a
layer). One JSON line; run it with the Python verl runs in (the grid's chains run it at setup).

    python3 scripts/gpu/gpu_host_probe.py [--repeats 3]

Each line also says the CPU steal while it ran and what else the host ran then (`context`).

Hosts reporting the same CPU model ran the same verl work ~1.4x apart (docs/placement.md, "Batch V"): the figures
here are what tells them apart."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verl_cluster.diagnostics.probe_node import _read, cpu_info, cpu_ticks, host_python_ms, steal_pct  # noqa: E402


def process_ticks() -> dict[int, tuple[str, int]]:
    """Every process's name and CPU ticks so far (utime + stime, /proc/PID/stat)."""
    out = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        name, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
        out[int(d)] = (name, int(rest[11]) + int(rest[12]))
    return out


def context(before: dict, after: dict, seconds: float, top: int = 4) -> dict:
    """What else ran on the host while the probe did (the chain's probes read ~2x the standalone ones on one machine,
    docs/BENCHMARKS.md "Batch R"): the busiest other processes in CPUs, the load, this process's CPU share limits."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    me = os.getpid()
    busy = sorted((max(0, after[p][1] - before[p][1]) / hz / max(seconds, 1e-6), after[p][0], p) for p in after
                  if p in before and p != me)  # max: a pid reused meanwhile
    load = (_read("/proc/loadavg") or "? ? ? ?").split()
    groups = _read("/proc/self/cgroup").splitlines()
    cg = groups[-1].split(":")[-1] if groups else None
    cpu_max = Path(f"/sys/fs/cgroup{cg}/cpu.max") if cg else None
    return {"others_cpus": round(sum(b for b, _, _ in busy), 2),
            "busiest": [[n, p, round(b, 2)] for b, n, p in busy[::-1][:top] if b > 0.05],
            "loadavg_1m": load[0], "running": load[3], "nice": os.nice(0),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "cgroup": cg, "cpu_max": cpu_max.read_text().strip() if cpu_max and cpu_max.exists() else None}


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
        ticks, procs, t0 = cpu_ticks(), process_ticks(), time.perf_counter()
        doc = {"probe": i, "t": round(time.time(), 1), "python": platform.python_version(),
               "host_python_ms": host_python_ms(), "cpu": cpu_info()}
        try:
            doc.update(gpu_latencies())
        except Exception as e:  # noqa: BLE001 - no torch, or CUDA failing: the Python probe alone, and why
            doc["gpu_error"] = f"{type(e).__name__}: {e}"
        doc["steal_pct"] = steal_pct(ticks, cpu_ticks())
        doc["context"] = context(procs, process_ticks(), time.perf_counter() - t0)
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
