#!/usr/bin/env python3
"""Benchmarks for `check` on namespace hosts (root; run from the repo root):

1. TCP bandwidth that `check` reports for a namespace pair vs iperf3 on the same pair, same run (target >= 0.9x)
2. wall time of a full `check` (no --quick) of 8 namespace nodes (target < 15 s)

    python scripts/bench/bench_check.py [--seconds 2] [--nodes 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tests/ is a regular package, so it wins over a site-packages `tests`

from tests.harness import NetnsLab  # noqa: E402
from verl_cluster.config.cluster import load_cluster  # noqa: E402
from verl_cluster.diagnostics.check import CheckOptions, run_check  # noqa: E402
from verl_cluster.diagnostics.gather import make_runners  # noqa: E402


def iperf3(runners, server_host: str, client_host: str, server_ip: str, seconds: float) -> float:
    server = runners[server_host].popen(["iperf3", "-s", "-1", "-p", "5299"])
    try:
        for _ in range(50):
            res = runners[client_host].run(["iperf3", "-c", server_ip, "-p", "5299", "-t", str(seconds), "-J"],
                                           timeout=seconds + 30)
            end = json.loads(res.stdout or "{}").get("end", {}) if res.ok else {}
            if "sum_received" in end:
                return end["sum_received"]["bits_per_second"] / 1e9
            time.sleep(0.1)  # server not listening yet
        raise RuntimeError(f"iperf3 failed: {res.tail(3)}")
    finally:
        server.terminate()


def bench_pair(seconds: float, repeat: int) -> dict:
    rows = []
    with NetnsLab() as lab:
        head, w1 = lab.add_host("head"), lab.add_host("w1")
        spec = load_cluster(lab.cluster_yaml(head, [w1]))
        runners = make_runners(spec)
        try:
            for _ in range(repeat):
                report = run_check(spec, runners=runners,
                                   options=CheckOptions(stream_seconds=seconds, collective=False))
                ours = report.links[0].bandwidth_gbps
                ref = iperf3(runners, w1.ip, head.ip, w1.ip, seconds)
                rows.append({"check_gbps": round(ours, 2), "iperf3_gbps": round(ref, 2),
                             "ratio": round(ours / ref, 3)})
        finally:
            for r in runners.values():
                r.close()
    return {"seconds": seconds, "runs": rows, "median_ratio": statistics.median(r["ratio"] for r in rows)}


def bench_full(nodes: int, repeat: int) -> dict:
    times = []
    with NetnsLab() as lab:
        hosts = [lab.add_host(f"n{i}") for i in range(nodes)]
        spec = load_cluster(lab.cluster_yaml(hosts[0], hosts[1:]))
        for _ in range(repeat):
            t0 = time.monotonic()
            report = run_check(spec)
            times.append(round(time.monotonic() - t0, 2))
            assert not report.unreachable and len(report.links) == nodes * (nodes - 1) // 2, report.problems
    return {"nodes": nodes, "pairs": nodes * (nodes - 1) // 2, "wall_s": times, "median_s": statistics.median(times),
            "ok": report.ok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="stream duration for both tools")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = {"pair": bench_pair(args.seconds, args.repeat), "full": bench_full(args.nodes, args.repeat)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
