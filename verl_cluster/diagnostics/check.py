"""`check`: facts -> backend -> verdicts -> port matrix -> links -> UCX -> collectives, into one CheckReport.

Every step has a timeout and a node that fails a step becomes a problem, never a hang or a lost node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.diagnostics import collective, netperf, ports, ray_versions
from verl_cluster.diagnostics.backend import BackendChoice, select_backend
from verl_cluster.diagnostics.gather import gather_facts, make_runners
from verl_cluster.diagnostics.verdicts import (ERROR, WARNING, Problem, consistency_verdicts, mtu_verdicts,
                                               node_verdicts)
from verl_cluster.errors import ConnectError, RunnerError
from verl_cluster.facts import measured_bus
from verl_cluster.facts.model import NodeFacts, to_dict
from verl_cluster.launchers import launcher_for
from verl_cluster.runners import CommandRunner, fan_out

MIN_GBPS = 1.0  # below this a multi-node RL run spends most of its time waiting on weight/grad transfer


@dataclass(frozen=True)
class CheckOptions:
    quick: bool = False  # skip bandwidth, UCX and collectives
    facts_timeout_s: float = 90.0
    deep: bool = False  # also import verl on every node (slow), not just read its version
    connect_timeout_s: float = 2.0  # each TCP connect of the port matrix
    stream_seconds: float = 0.5  # TCP stream duration per pair; short, since pairs run n-1 rounds
    ucx: Optional[bool] = None  # None: when the backend is ucx; True: also over tcp (UCX_TLS=tcp)
    collective: bool = True
    collective_timeout_s: float = 120.0


@dataclass(frozen=True)
class CheckReport:
    cluster: str
    backend: str
    choice: Optional[BackendChoice]
    facts: dict[str, NodeFacts]
    unreachable: dict[str, str]
    matrix: Optional[ports.PortMatrix]
    links: list[netperf.Link]
    ucx_links: list[netperf.Link]
    collectives: list[collective.CollectiveResult]
    problems: list[Problem]
    skipped: dict[str, str] = field(default_factory=dict)  # section -> why it did not run
    seconds: float = 0.0
    listeners: dict[str, list[dict]] = field(default_factory=dict)  # node -> every port our Ray listens on
    # of `unreachable`, the nodes we reached but could not probe (the Python beside their `ray` is not there)
    not_probed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(p.severity == ERROR for p in self.problems)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "cluster": self.cluster,
            "backend": self.backend,
            "env": self.choice.env if self.choice else {},
            "interfaces": self.choice.interfaces if self.choice else {},
            "reasons": self.choice.reasons if self.choice else [],
            "problems": [p.to_json() for p in self.problems],
            "links": [link.to_json() for link in self.links],
            "ucx_links": [link.to_json() for link in self.ucx_links],
            "ports": self.matrix.to_json() if self.matrix else None,
            "collectives": [c.to_json() for c in self.collectives],
            "listeners": self.listeners,
            "unreachable": self.unreachable,
            "not_probed": self.not_probed,
            "skipped": self.skipped,
            "facts": {h: to_dict(f) for h, f in self.facts.items()},
            "seconds": round(self.seconds, 2),
        }


def _ssh_fix(err: RunnerError) -> str:
    return err.hint or "check that the host is up, sshd runs, and ssh settings (user, key, known_hosts) are right"


def run_check(spec: ClusterSpec, quick: bool = False, runners: Mapping[str, CommandRunner] | None = None,
              options: CheckOptions | None = None,
              progress: Callable[[str], None] | None = None) -> CheckReport:
    opts = options or CheckOptions(quick=quick)
    if quick and not opts.quick:
        opts = CheckOptions(**{**opts.__dict__, "quick": True})
    say = progress or (lambda msg: None)
    t0 = time.monotonic()
    own_runners = runners is None
    runners = dict(runners) if runners is not None else make_runners(spec)
    problems: list[Problem] = []
    skipped: dict[str, str] = {}
    try:
        # 1. SSH reachability + facts
        say("gathering node facts")
        gathered = gather_facts(spec, runners, timeout=opts.facts_timeout_s, deep=opts.deep)
        facts = {h: f for h, f in gathered.items() if isinstance(f, NodeFacts)}
        unreachable = {h: e.reason for h, e in gathered.items() if isinstance(e, RunnerError)}
        not_probed = {h: e.reason for h, e in gathered.items()
                      if isinstance(e, RunnerError) and not isinstance(e, ConnectError)}
        for h, e in gathered.items():
            if isinstance(e, RunnerError):  # only a failed login is "unreachable": a wrong setting says itself
                problems.append(Problem(h, f"unreachable: {e.reason}" if isinstance(e, ConnectError) else e.reason,
                                        _ssh_fix(e)))

        # 2. backend + interfaces; 5. verdicts
        choice = select_backend(spec, facts)
        problems += [Problem(n, what, fix) for n, what, fix in choice.problems]
        expect = {n.host: n.gpus for _, n in spec.nodes()}
        for h, f in facts.items():
            problems += node_verdicts(f, expect.get(h))
        problems += consistency_verdicts(facts)
        problems += ray_versions.ray_verdicts({h: f.versions.get("ray") for h, f in facts.items()}, spec.head.host,
                                              ray_versions.local_ray_version(), spec.security.auth == "token")
        problems += mtu_verdicts(facts, choice.interfaces)
        problems += _temp_dir_problems(spec, runners, [n.host for _, n in spec.nodes() if n.host in facts])

        # 3. port matrix (and the perf servers, on the same listeners process)
        matrix, links = None, []
        hosts = [n.host for _, n in spec.nodes() if n.host in facts]
        if hosts:
            say(f"port matrix across {len(hosts)} nodes")
            with ports.ServeSession(spec, runners, hosts, lifetime_s=300) as session:
                matrix = ports.probe_matrix(spec, runners, session, opts.connect_timeout_s)
                for node, what, fix in ports.port_problems(spec, matrix):
                    problems.append(Problem(node, what, fix))
                for h, why in matrix.errors.items():
                    problems.append(Problem(h, f"port test could not run: {why}", "see the node's Python and /tmp"))
                if opts.quick:
                    skipped["links"] = "--quick"
                elif len(hosts) < 2:
                    skipped["links"] = "one node"
                else:
                    say("latency and bandwidth per node pair")
                    links = netperf.measure_links(spec, runners, session, seconds=opts.stream_seconds)
        listeners = _listeners(spec, runners, hosts, matrix, problems, skipped, say)
        for link in links:
            if link.error:
                problems.append(Problem(f"{link.src} -> {link.dst}", f"link test failed: {link.error}",
                                        f"open TCP {spec.ray.ports.max_worker} from {link.src} to {link.dst}"))
            elif link.bandwidth_gbps is not None and link.bandwidth_gbps < MIN_GBPS:
                problems.append(Problem(f"{link.src} -> {link.dst}",
                                        f"only {link.bandwidth_gbps:.2f} Gbit/s TCP between them",
                                        "check the chosen interface and link speed (ethtool)", WARNING))

        # 4a. ucx_perftest
        ucx_links: list[netperf.Link] = []
        want_ucx = opts.ucx if opts.ucx is not None else choice.backend == "ucx"
        if opts.quick or not want_ucx or len(hosts) < 2:
            skipped["ucx"] = "--quick" if opts.quick else ("one node" if want_ucx else f"backend is {choice.backend}")
        elif not all(facts[h].ucx_version for h in hosts):
            missing = [h for h in hosts if not facts[h].ucx_version]
            problems.append(Problem(", ".join(missing), "ucx_perftest not found", "apt install ucx-utils", WARNING))
        else:
            say("ucx_perftest per node pair")
            force_tcp = choice.backend != "ucx"
            ucx_links = netperf.ucx_links(spec, runners, choice.env, ports.perf_candidates(spec)[4],
                                          force_tcp=force_tcp)
            for link in ucx_links:
                if link.error:
                    problems.append(Problem(f"{link.src} -> {link.dst}", link.error,
                                            "check UCX_TLS/UCX_NET_DEVICES and that UCX sees the device "
                                            "(ucx_info -d)"))

        # 4b. collectives, with the cluster up
        collectives = _collectives(spec, runners, choice, facts, hosts, matrix, opts, skipped, say)
        for c in collectives:
            if c.ok:
                keep_bus(spec.cluster_name, c)
            else:
                problems.append(Problem("cluster", f"{c.backend} all-reduce failed: {c.error or 'wrong result'}",
                                        "check the chosen interface (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) "
                                        f"and that TCP {collective.collective_port(spec)} is open between nodes"))
    finally:
        if own_runners:
            fan_out(list(runners.values()), lambda r: r.close(), key=lambda r: r.host)
    # e.g. a node Slurm drained mid-allocation: it still runs, until it does not
    problems += [Problem(node, what, fix, WARNING) for node, what, fix in launcher_for(spec).node_problems()]
    problems.sort(key=lambda p: (p.severity != ERROR, p.node))
    return CheckReport(spec.cluster_name, choice.backend, choice, facts, unreachable, matrix, links, ucx_links,
                       collectives, problems, skipped, time.monotonic() - t0, listeners, not_probed)


def keep_bus(cluster: str, c: collective.CollectiveResult) -> None:
    """Record a collective that came out right with the cluster's state: `plan` charges FSDP traffic at NCCL's."""
    nodes = c.nodes or (c.world if c.backend == "gloo" else 0)  # gloo: one rank per node
    m = measured_bus.measure_of(cluster, c.backend, nodes, c.world, c.results)
    if m is not None:
        measured_bus.record(m)


def _temp_dir_problems(spec: ClusterSpec, runners: Mapping[str, CommandRunner], hosts: list[str]) -> list[Problem]:
    """Per node, judged there: a temp dir other local users can reach (its parent loosened, someone else's folder),
    or this cluster's Ray still under the earlier default temp dir in the shared /tmp."""
    from verl_cluster.nodes.agent import Node, temp_dir_findings

    nodes = {n.host: (role, n) for role, n in spec.nodes()}
    out = []
    for r in fan_out(hosts, lambda h: Node(spec, nodes[h][0], nodes[h][1], runners[h]).probe()):
        if r.ok:
            out += [Problem(r.host, what, fix) for what, fix in temp_dir_findings(spec, r.value)]
        else:
            out.append(Problem(r.host, f"the temp dir could not be judged: {r.reason}", "see the node's Python",
                               WARNING))
    return out


def _listeners(spec, runners, hosts, matrix, problems, skipped, say) -> dict[str, list[dict]]:
    """With the cluster up: every port our Ray listens on, per node, and how each answers without the token."""
    if matrix is None or not matrix.live:
        skipped["listeners"] = "the cluster is not up"
        return {}
    say("ports our Ray listens on")
    found, errors = ports.ray_listeners(spec, runners, hosts)
    problems += [Problem(n, what, fix, WARNING) for n, what, fix in ports.listener_problems(spec, found)]
    problems += [Problem(h, f"could not list Ray's listeners: {why}", "see the node's Python", WARNING)
                 for h, why in errors.items()]
    return found


def _collectives(spec, runners, choice, facts, hosts, matrix, opts, skipped, say) -> list:
    out = []
    if opts.quick or not opts.collective:
        skipped["collective"] = "--quick" if opts.quick else "disabled"
        return out
    if matrix is None or not matrix.live:
        skipped["collective"] = "the cluster is not up (run `verl-cluster up` first)"
        return out
    if len(hosts) != len(spec.nodes()):
        skipped["collective"] = "not every node is reachable"
        return out
    no_torch = [h for h in hosts if "torch" not in facts[h].versions]
    if no_torch:
        skipped["collective"] = f"torch is not importable on {', '.join(no_torch)}"
        return out
    if len(hosts) >= 2:
        say("gloo all-reduce across nodes")
        out.append(collective.run_collective(spec, runners, choice.env, "gloo",
                                             timeout=opts.collective_timeout_s))
    else:
        skipped["gloo"] = "one node"
    n_gpus = sum(len(facts[h].gpus) for h in hosts)
    if n_gpus >= 2 and all(facts[h].versions.get("torch_cuda") for h in hosts):
        say(f"NCCL all-reduce across {n_gpus} GPUs")
        out.append(collective.run_collective(spec, runners, choice.env, "nccl", iters=20, warmup=5,
                                             timeout=opts.collective_timeout_s))
    else:
        skipped["nccl"] = "fewer than 2 GPUs or torch without CUDA"
    return out
