"""Deprecated: this machine's facts for callers that still import `local_node_facts` from here
(launch/gpu_smoke_job.py). The former pynvml reader was wrong on the 2x H200 machine (the NVLinked pair came out
as two P2P islands, and it had no package facts, so flash-attn was assumed); it now returns what the
diagnostics probe collects. Use `verl_cluster.diagnostics.gather.local_facts(head_ip=None, deep=False)`."""

from __future__ import annotations

from verl_cluster.facts.model import NodeFacts


def local_node_facts() -> NodeFacts:
    from verl_cluster.diagnostics.gather import local_facts

    return local_facts(head_ip=None, deep=False)
