"""Gather NodeFacts from every node in parallel (probe_node.py shipped as source over the runners)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Mapping, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import probe_node
from verl_cluster.errors import RunnerError
from verl_cluster.facts import nvml_node
from verl_cluster.facts.model import NodeFacts, from_dict
from verl_cluster.launchers import runner_for
from verl_cluster.runners import CommandRunner, fan_out
from verl_cluster.runners.remote_python import run_python, script_source

PROBE_SOURCE = script_source(probe_node.__file__, nvml_node.__file__)


def make_runners(spec: ClusterSpec) -> dict[str, CommandRunner]:
    return {node.host: runner_for(spec, node) for _, node in spec.nodes()}


def facts_from_probe(host: str, data: dict) -> NodeFacts:
    """The probe's JSON -> NodeFacts, keyed by the configured host (not the node's own hostname)."""
    return from_dict(NodeFacts, {**data, "host": host})


def _clock_offset(runner: CommandRunner) -> Optional[float]:
    """Node clock minus ours, from one short round trip on the already-open connection."""
    t0 = time.time()
    res = runner.run(["date", "+%s.%N"], timeout=10)
    t1 = time.time()
    try:
        return float(res.stdout.strip()) - (t0 + t1) / 2
    except ValueError:
        return None


def probe(spec: ClusterSpec, node, runner: CommandRunner, timeout: float, deep: bool = False) -> NodeFacts:
    args = [spec.head_ip] + (["--deep"] if deep else [])
    data = run_python(runner, spec.python_executable(node), PROBE_SOURCE, args, timeout=timeout)
    facts = facts_from_probe(node.host, data)
    return replace(facts, clock_offset_s=_clock_offset(runner))


def gather_facts(spec: ClusterSpec, runners: Mapping[str, CommandRunner] | None = None,
                 timeout: float = 90.0, deep: bool = False) -> dict[str, NodeFacts | RunnerError]:
    """Facts of every node, keyed by node host; an unreachable node maps to the RunnerError that says why.
    deep=True also imports verl on every node (~3 s of CPU each) instead of reading its version.

    clock_offset_s is made relative to the head's clock (the head's own is 0.0).
    """
    own = runners is None
    runners = dict(runners) if runners is not None else make_runners(spec)
    nodes = [node for _, node in spec.nodes()]
    try:
        results = fan_out(nodes, lambda n: probe(spec, n, runners[n.host], timeout, deep), key=lambda n: n.host)
    finally:
        if own:  # runners passed in are the caller's to close
            fan_out(list(runners.values()), lambda r: r.close(), key=lambda r: r.host)
    out: dict[str, NodeFacts | RunnerError] = {}
    for r in results:
        if r.ok:
            out[r.host] = r.value
        elif isinstance(r.error, RunnerError):
            out[r.host] = r.error
        else:
            out[r.host] = RunnerError(r.host, r.reason)
    head = out.get(spec.head.host)
    if isinstance(head, NodeFacts) and head.clock_offset_s is not None:
        base = head.clock_offset_s
        for host, f in out.items():
            if isinstance(f, NodeFacts) and f.clock_offset_s is not None:
                out[host] = replace(f, clock_offset_s=round(f.clock_offset_s - base, 4))
    return out


def local_facts(head_ip: str | None = None, deep: bool = True) -> NodeFacts:
    """Facts of this machine, collected in-process (doctor)."""
    data = probe_node.collect(head_ip, deep=deep)
    return facts_from_probe(data["host"], data)
