#!/usr/bin/env python3
"""Where a verl update's micro batches spend their time: read the torch profiler's chrome traces (verl's
`global_profiler.tool=torch`, one file per role and stage with `discrete`) and say, per trace, for the spans named
`micro_batch<i>` (verl 0.9.1's forward_backward_batch names each micro batch so):

- the span's wall time, the GPU's kernel time launched inside it, and the host's time blocked in syncs
  (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a device-to-host cudaMemcpy);
- the host's operators by self time (time in the op less its child ops), summed over the micro batches;
- each micro batch on its own, in order, with the `mini_batch<j>` span it ran in (when the trace has them): whether
  the cost falls on every micro batch or only on those after a mini batch's first (gradient accumulation);
- the traced stage outside its micro batches (optimizer step, clipping, the data's fetch, metrics) and its host
  ops by self time: what an update costs beyond its micro batches.

Issue 33: an actor's micro batch costs ~0.3-0.45 s of host work that a critic's does not; this names which part.

    profile_summary.py DIR_OR_FILE... [--json F] [--top N]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

MICRO = re.compile(r"^micro_batch(\d+)$")
MINI = re.compile(r"^mini_batch(\d+)$")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
HOST_CATS = ("cpu_op", "user_annotation", "python_function")


def load(path: Path) -> list[dict]:
    """The trace's complete events (ph "X"), from a .json or .json.gz chrome trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def self_times(events: list[dict]) -> dict[int, float]:
    """id(event) -> its duration less its direct children's, for the host's events of each thread (nested by time)."""
    out: dict[int, float] = {}
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_CATS:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            out[id(e)] = float(e["dur"])
            if stack:
                out[id(stack[-1])] -= e["dur"]
            stack.append(e)
    return out


def kernels_by_correlation(events: list[dict]) -> dict[Any, float]:
    """correlation id -> GPU time (us) of the kernels and copies it launched."""
    out: dict[Any, float] = defaultdict(float)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                out[corr] += e["dur"]
    return out


def inside(span: dict, e: dict) -> bool:
    """E ran within the span, in its process on any thread: autograd runs a CUDA backward on a thread of its own."""
    return e.get("pid") == span.get("pid") and span["ts"] <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"]


def summarize(events: list[dict], top: int = 15) -> Optional[dict[str, Any]]:
    """One trace's micro batches (None when it has none)."""
    spans = sorted((e for e in events if e.get("cat") == "user_annotation" and MICRO.match(str(e.get("name")))),
                   key=lambda e: e["ts"])
    if not spans:
        return None
    selfs, gpu = self_times(events), kernels_by_correlation(events)
    pid = spans[0].get("pid")  # the micro batches' process (verl's worker of the traced rank)
    host = [e for e in events if e.get("cat") in HOST_CATS + ("cuda_runtime", "cuda_driver")]
    ops: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    outside: dict[str, float] = defaultdict(float)
    g, w = [0.0] * len(spans), [0.0] * len(spans)
    starts = [sp["ts"] for sp in spans]
    # one pass: each host event in the micro batch that holds it (verl runs them one after another: they do not
    # overlap), else, in their process and holding none of them, in the stage outside them (the optimizer step,
    # gradient clipping, the data's fetch and split, the metrics: what an update costs beyond its micro batches)
    for e in host:
        if MICRO.match(str(e.get("name"))):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and inside(spans[i], e):
            if e.get("cat") in ("cuda_runtime", "cuda_driver"):
                g[i] += gpu.get((e.get("args") or {}).get("correlation"), 0.0)
                if str(e.get("name")).startswith(SYNCS):
                    w[i] += e["dur"]
            else:
                ops[e["name"]] += selfs.get(id(e), 0.0)
                calls[e["name"]] += 1
            continue
        after = bisect.bisect_left(starts, e["ts"])
        holds = after < len(spans) and inside(e, spans[after])
        if e.get("cat") in HOST_CATS and e.get("pid") == pid and not holds:
            outside[e["name"]] += selfs.get(id(e), 0.0)
    minis = [e for e in events if e.get("cat") == "user_annotation" and MINI.match(str(e.get("name")))]
    each = []
    for i, span in enumerate(spans):
        mini = next((m for m in minis if inside(m, span)), None)
        each.append({"micro_batch": int(MICRO.match(span["name"]).group(1)),
                     "mini_batch": int(MINI.match(mini["name"]).group(1)) if mini else None,
                     "wall_ms": round(span["dur"] / 1e3, 3), "gpu_ms": round(g[i] / 1e3, 3),
                     "sync_ms": round(w[i] / 1e3, 3)})
    n = len(spans)
    ranked = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
    mine = [e for e in host if e.get("pid") == pid]
    stage = max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)
    return {"micro_batches": n, "stage_ms": round(stage / 1e3, 3),
            "outside_ms": round((stage - sum(sp["dur"] for sp in spans)) / 1e3, 3),
            "outside_ops": [{"op": k, "self_ms": round(v / 1e3, 3)}
                            for k, v in sorted(outside.items(), key=lambda kv: -kv[1])[:top]],
            "wall_ms": round(sum(r["wall_ms"] for r in each) / n, 3),
            "gpu_ms": round(sum(r["gpu_ms"] for r in each) / n, 3),
            "sync_ms": round(sum(r["sync_ms"] for r in each) / n, 3),
            "host_ops": [{"op": k, "self_ms": round(v / n / 1e3, 3), "calls": round(calls[k] / n, 1)}
                         for k, v in ranked],
            "each": each}


def traces(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out += sorted(q for q in p.rglob("*.json*") if q.name.endswith((".json", ".json.gz"))) if p.is_dir() else [p]
    return out


def markdown(rows: dict[str, dict]) -> str:
    out = []
    for name, r in rows.items():
        out += [f"{name}: {r['micro_batches']} micro batches, each {r['wall_ms']:.1f} ms wall, {r['gpu_ms']:.1f} ms of "
                f"GPU work launched, {r['sync_ms']:.1f} ms blocked in syncs", "",
                "| host op | self ms / micro batch | calls |", "|---|---|---|"]
        out += [f"| {o['op']} | {o['self_ms']:.2f} | {o['calls']:g} |" for o in r["host_ops"]]
        if "stage_ms" in r:
            out += ["", f"the traced stage: {r['stage_ms']:.1f} ms, {r['outside_ms']:.1f} ms of it outside the micro "
                        "batches", "", "| host op outside the micro batches | self ms |", "|---|---|"]
            out += [f"| {o['op']} | {o['self_ms']:.2f} |" for o in r["outside_ops"]]
        out += ["", "| mini batch | micro batch | wall ms | GPU ms | sync ms |", "|---|---|---|---|---|"]
        out += [f"| {'-' if m['mini_batch'] is None else m['mini_batch']} | {m['micro_batch']} | {m['wall_ms']:.1f} | "
                f"{m['gpu_ms']:.1f} | {m['sync_ms']:.1f} |" for m in r.get("each", ())]
        out.append("")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="chrome traces (.json, .json.gz) or folders holding them")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    ap.add_argument("--top", type=int, default=15, help="host ops listed per trace (default 15)")
    a = ap.parse_args(argv)
    missing = [str(p) for p in a.paths if not p.exists()]
    if missing:
        print(f"error: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = {}
    for path in traces(a.paths):
        try:
            got = summarize(load(path), a.top)
        except (OSError, ValueError, KeyError) as e:
            print(f"{path}: not a chrome trace ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        if got:
            rows[str(path)] = got
    if not rows:
        print("error: no trace with micro_batch<i> spans (was the update stage profiled?)", file=sys.stderr)
        return 1
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
