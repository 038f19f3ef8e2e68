"""Latency and bandwidth for every node pair: our own TCP stream test (netprobe.py `perf` against the perf
server of a ServeSession), and `ucx_perftest` between pairs when the backend is UCX (or forced over tcp).

Pairs run in rounds of disjoint pairs (round-robin schedule), so n nodes take n-1 rounds, not n(n-1)/2.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Mapping, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics.ports import NETPROBE_SOURCE, ServeSession
from verl_cluster.runners import CommandRunner, fan_out
from verl_cluster.runners.remote_python import run_python


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    latency_ms: Optional[float] = None  # median TCP round trip of 1 byte
    bandwidth_gbps: Optional[float] = None  # TCP stream, src -> dst
    ucx_bandwidth_gbps: Optional[float] = None
    error: Optional[str] = None

    def to_json(self) -> dict:
        out = {"src": self.src, "dst": self.dst,
               "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 4),
               "bandwidth_gbps": None if self.bandwidth_gbps is None else round(self.bandwidth_gbps, 3)}
        if self.ucx_bandwidth_gbps is not None:
            out["ucx_bandwidth_gbps"] = round(self.ucx_bandwidth_gbps, 3)
        if self.error:
            out["error"] = self.error
        return out


def pair_rounds(hosts: list[str]) -> list[list[tuple[str, str]]]:
    """Every unordered pair exactly once, grouped into rounds where no host appears twice (circle method)."""
    items = list(hosts) + ([None] if len(hosts) % 2 else [])
    n = len(items)
    rounds = []
    for _ in range(n - 1):
        pairs = [(items[i], items[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        items = [items[0], items[-1]] + items[1:-1]
    return [r for r in rounds if r]


def measure_links(spec: ClusterSpec, runners: Mapping[str, CommandRunner], session: ServeSession,
                  seconds: float = 0.5, pings: int = 20) -> list[Link]:
    """TCP latency + stream bandwidth src -> dst for every pair of nodes that have a perf server."""
    nodes = {n.host: n for _, n in spec.nodes()}
    hosts = [h for h in nodes if h in session.servers and session.servers[h].perf_port]
    links: list[Link] = []

    def one(pair: tuple[str, str]) -> Link:
        src, dst = pair
        data = run_python(runners[src], spec.python_executable(nodes[src]), NETPROBE_SOURCE,
                          ["perf", spec.node_ip(nodes[dst]), str(session.servers[dst].perf_port), str(seconds),
                           str(pings)], timeout=seconds + 30)
        return Link(src, dst, data.get("latency_ms"), data.get("bandwidth_gbps"))

    for rnd in pair_rounds(hosts):
        for r in fan_out(rnd, one, key=lambda p: f"{p[0]}->{p[1]}"):
            if r.ok:
                links.append(r.value)
            else:
                src, dst = r.host.split("->")
                links.append(Link(src, dst, error=r.reason))
    return links


_CSV = re.compile(r"^\s*\d+,[\d.]+,[\d.]+,[\d.]+,([\d.]+),([\d.]+),")


def parse_perftest(text: str) -> Optional[float]:
    """Overall bandwidth in Gbit/s from `ucx_perftest -v` output (MB/s there is MiB/s)."""
    for line in reversed(text.splitlines()):
        m = _CSV.match(line)
        if m:
            return float(m.group(2)) * 2**20 * 8 / 1e9
    return None


def ucx_links(spec: ClusterSpec, runners: Mapping[str, CommandRunner], env: Mapping[str, Mapping[str, str]],
              port: int, force_tcp: bool = False, size: int = 1 << 20, iters: int = 200,
              timeout: float = 30.0) -> list[Link]:
    """`ucx_perftest tag_bw` for every pair, one pair at a time (each server serves one test)."""
    nodes = {n.host: n for _, n in spec.nodes()}
    hosts = list(nodes)
    links = []

    def ucx_env(host: str) -> dict[str, str]:
        e = {k: v for k, v in env.get(host, {}).items() if k.startswith("UCX_")}
        if force_tcp:
            e["UCX_TLS"] = "tcp"
            e["UCX_NET_DEVICES"] = env.get(host, {}).get("GLOO_SOCKET_IFNAME", "all")
        return e

    for rnd in pair_rounds(hosts):
        def one(pair: tuple[str, str]) -> Link:
            src, dst = pair
            server = runners[dst].popen(["ucx_perftest", "-p", str(port)], env=ucx_env(dst))
            client = ["ucx_perftest", spec.node_ip(nodes[dst]), "-p", str(port), "-t", "tag_bw",
                      "-s", str(size), "-n", str(iters), "-w", "10", "-v"]
            try:
                deadline = time.monotonic() + 10
                while True:  # the server needs a moment to listen; the client fails fast until it does
                    res = runners[src].run(client, env=ucx_env(src), timeout=timeout)
                    if "Connection refused" not in res.stdout + res.stderr or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            finally:
                server.terminate()
            bw = parse_perftest(res.stdout)
            if bw is None:
                return Link(src, dst, error=f"ucx_perftest failed (rc={res.rc}): {res.tail(2)}")
            return Link(src, dst, ucx_bandwidth_gbps=bw)

        for r in fan_out(rnd, one, key=lambda p: f"{p[0]}->{p[1]}"):
            if r.ok:
                links.append(r.value)
            else:
                src, dst = r.host.split("->")
                links.append(Link(src, dst, error=f"ucx_perftest: {r.reason}"))
    return links
