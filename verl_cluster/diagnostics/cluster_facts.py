"""The facts of every node of a live cluster, as Ray will use them: what a plan is made on.

It probes (diagnostics/gather.py over the runners), so placement never calls it: placement takes the list this
returns. An unreachable node is an error naming it, never a plan for fewer nodes than verl will use.
"""

from __future__ import annotations

from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import gather
from verl_cluster.errors import RunnerError
from verl_cluster.facts.measured_bus import BusMeasure, recorded
from verl_cluster.facts.model import NodeFacts
from verl_cluster.facts.ray_view import as_ray_sees


def gather_node_facts(spec: ClusterSpec, *, runners=None, timeout: float = 90.0) -> list[NodeFacts]:
    """Facts of every node of `spec`, in the spec's node order; the first unreachable node raises its
    RunnerError (the others that failed are named in its hint)."""
    got = gather.gather_facts(spec, runners, timeout=timeout)
    hosts = [node.host for _, node in spec.nodes()]
    failed = [(h, got.get(h)) for h in hosts if not isinstance(got.get(h), NodeFacts)]
    if failed:
        host, e = failed[0]
        reason = e.reason if isinstance(e, RunnerError) else (str(e) if e else "no facts came back")
        others = ", ".join(h for h, _ in failed[1:])
        hint = (f"also unreachable: {others}. " if others else "") + \
            "`verl-cluster check CLUSTER.yaml` shows why; or plan from recorded facts with --facts FILE.json"
        raise RunnerError(host, f"cannot gather facts for the plan: {reason}", hint)
    # the GPUs Ray is given on each node (its `gpus:` / the allocation's count, its CUDA_VISIBLE_DEVICES), not
    # every GPU NVML lists: verl's placement groups ask Ray for them
    return [as_ray_sees(got[h], node.gpus, {**spec.ray.env, **node.env})  # type: ignore[arg-type]
            for (_, node), h in zip(spec.nodes(), hosts)]


def cluster_bus(cluster_file: Optional[str]) -> tuple[BusMeasure, ...]:
    """`check`'s recorded all-reduce measurements of the cluster this file describes (none without a file): what
    `plan -c` hands the planner so FSDP traffic is charged at the cluster's measured bandwidth."""
    if not cluster_file:
        return ()
    from verl_cluster.launchers import load_cluster

    return recorded(load_cluster(cluster_file).cluster_name)
