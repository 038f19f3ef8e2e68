#!/usr/bin/env python3
"""Host <-> GPU copy rate on this machine, the figure the step-time model's PCIE_GBS stands for (verl's ref copies
its fp32 params from pinned host memory once per micro batch; param/optimizer offload moves them both ways).

    python3 scripts/gpu/gpu_pcie_copy.py [--gib 2] [--repeat 5]      # prints one JSON line

Pinned and pageable host buffers, host->GPU and GPU->host, the best of --repeat timed copies each (CUDA events)."""

from __future__ import annotations

import argparse
import json
import sys


def rate(torch, src, dst, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return src.numel() * src.element_size() / best / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: torch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 1
    n = int(a.gib * 2**30) // 4
    gpu = torch.empty(n, dtype=torch.float32, device="cuda")
    out = {"device": torch.cuda.get_device_name(0), "gib": a.gib}
    for kind, pin in (("pinned", True), ("pageable", False)):
        host = torch.empty(n, dtype=torch.float32, pin_memory=pin)
        host.fill_(1.0)
        out[f"h2d_{kind}_gbs"] = round(rate(torch, host, gpu, a.repeat), 2)
        out[f"d2h_{kind}_gbs"] = round(rate(torch, gpu, host, a.repeat), 2)
        del host
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
