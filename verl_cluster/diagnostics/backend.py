"""Choose the transport (ucx or tcp) and, per node, the network interface; build the env Ray workers get.

Pure: takes the spec and gathered facts, never probes. Every choice comes with a reason a human can read.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Mapping

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.facts.model import Interface, NodeFacts

RDMA_TRANSPORTS = ("rc", "rc_verbs", "rc_mlx5", "ud", "ud_verbs", "ud_mlx5", "dc", "dc_mlx5")
# interface kinds that usually do not carry traffic between machines
SKIP_KINDS = ("loopback", "docker", "bridge", "veth", "virtual", "dummy", "tun", "tap", "ifb")
SKIP_PREFIXES = ("lo", "docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "lxc")


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "tcp" | "ucx"
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # node host -> VAR -> value
    interfaces: dict[str, str] = field(default_factory=dict)  # node host -> chosen interface
    reasons: list[str] = field(default_factory=list)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (node, what, fix)

    def to_json(self) -> dict:
        return {"backend": self.backend, "env": self.env, "interfaces": self.interfaces,
                "reasons": list(self.reasons)}


def config_network_env(spec: ClusterSpec) -> dict[str, str]:
    """What the config alone says (no facts): an explicitly named interface, and no InfiniBand for tcp.
    The base under `select_backend`'s per-node env, and the whole env when no node facts can be had."""
    env: dict[str, str] = {}
    if spec.network.interface != "auto":
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = spec.network.interface
    if spec.network.backend == "tcp":
        env["NCCL_IB_DISABLE"] = "1"
    return env


def _skippable(i: Interface) -> bool:
    return i.kind in SKIP_KINDS or i.name.startswith(SKIP_PREFIXES)


def _same_subnet(iface: Interface, ip: str) -> bool:
    try:
        target = ipaddress.ip_address(ip)
    except ValueError:
        return False
    for a in iface.addresses:
        try:
            if target in ipaddress.ip_interface(a).network:
                return True
        except ValueError:
            continue
    return False


def _holds(iface: Interface, ip: str) -> bool:
    return any(a.split("/")[0] == ip for a in iface.addresses)


def pick_interface(facts: NodeFacts, head_ip: str, node_ip: str) -> tuple[str | None, str]:
    """(interface, reason) for `network.interface: auto` on one node."""
    by_name = {i.name: i for i in facts.interfaces}
    # the head itself routes its own address over lo: take the interface that holds it
    if facts.route_to_head in (None, "lo"):
        for ip in (head_ip, node_ip):
            holder = next((i for i in facts.interfaces if _holds(i, ip) and i.name != "lo"), None)
            if holder:
                return holder.name, f"{holder.name}: holds {ip}"
        if facts.route_to_head == "lo":
            return None, f"head address {head_ip} is on loopback only"
        return None, f"no route to head {head_ip}"
    route = by_name.get(facts.route_to_head, Interface(facts.route_to_head))
    if not _skippable(route):
        return route.name, f"{route.name}: routes to head {head_ip}"
    # the route goes over a bridge/veth/docker link: prefer a real NIC on the head's subnet, if one exists
    real = [i for i in facts.interfaces if i.up and not _skippable(i) and _same_subnet(i, head_ip)]
    if real:
        return real[0].name, f"{real[0].name}: on head subnet of {head_ip} (route uses {route.name}, a {route.kind})"
    return route.name, f"{route.name}: only route to head {head_ip}"


def _rdma_ready(f: NodeFacts) -> tuple[bool, str]:
    if not f.rdma_devices:
        return False, "no RDMA device"
    if not f.ucx_version:
        return False, "no UCX (ucx_info not found)"
    rdma_tls = [t for t in f.ucx_transports if t in RDMA_TRANSPORTS]
    if not rdma_tls:
        return False, f"UCX has no RDMA transport (has {','.join(f.ucx_transports) or 'none'})"
    return True, f"RDMA {','.join(f.rdma_devices)}, UCX {','.join(rdma_tls)}"


def _ucx_tls(facts: Mapping[str, NodeFacts]) -> str:
    """rc/ud/dc families present on every node, plus shared memory and self."""
    common = None
    for f in facts.values():
        fam = {t.split("_")[0] for t in f.ucx_transports if t in RDMA_TRANSPORTS}
        common = fam if common is None else common & fam
    order = [t for t in ("rc", "ud", "dc") if t in (common or set())]
    return ",".join(order + ["sm", "self"])


def select_backend(spec: ClusterSpec, facts: Mapping[str, NodeFacts]) -> BackendChoice:
    """Backend and per-node env from facts of every node (keyed by node host). Nodes without facts are
    skipped (their problem is reported where the facts failed)."""
    reasons: list[str] = []
    problems: list[tuple[str, str, str]] = []
    nodes = [(role, n) for role, n in spec.nodes() if isinstance(facts.get(n.host), NodeFacts)]
    want = spec.network.backend

    # ---- backend ----
    not_ready = []
    for _, n in nodes:
        ok, why = _rdma_ready(facts[n.host])
        if not ok:
            not_ready.append(f"{why} on {n.host}")
    if want == "tcp":
        backend = "tcp"
        reasons.append("tcp: network.backend is tcp")
    elif not_ready:
        backend = "tcp"
        reasons.append("tcp: " + "; ".join(not_ready))
        if want == "ucx":
            for item in not_ready:
                host = item.rsplit(" on ", 1)[1]
                problems.append((host, f"network.backend is ucx but {item.rsplit(' on ', 1)[0]}",
                                 "install rdma-core + UCX with verbs support there, or set network.backend: tcp"))
    elif not nodes:
        backend = "tcp"
        reasons.append("tcp: no node facts")
    else:
        backend = "ucx"
        reasons.append(f"ucx: every node has an RDMA device and UCX with an RDMA transport"
                       f"{' (network.backend is ucx)' if want == 'ucx' else ''}")

    # ---- interface and env per node ----
    env: dict[str, dict[str, str]] = {}
    chosen: dict[str, str] = {}
    tls = _ucx_tls({n.host: facts[n.host] for _, n in nodes}) if backend == "ucx" else "tcp,sm,self"
    for role, n in nodes:
        f = facts[n.host]
        names = {i.name for i in f.interfaces}
        if spec.network.interface != "auto":
            iface = spec.network.interface
            if iface not in names:
                problems.append((n.host, f"network.interface `{iface}` does not exist there "
                                 f"(has {', '.join(sorted(names)) or 'none'})",
                                 "set network.interface: auto, or name an interface every node has"))
                continue
            reasons.append(f"{n.host}: {iface}: network.interface is set")
        else:
            iface, why = pick_interface(f, spec.head_ip, spec.node_ip(n))
            if iface is None and not spec.workers and f.route_to_head == "lo":
                iface, why = "lo", "lo: a one-node cluster on loopback needs no network"
            if iface is None:
                problems.append((n.host, why, f"give {n.host} a route to {spec.head_ip}, or set network.interface"))
                continue
            reasons.append(f"{n.host}: {why}")
        chosen[n.host] = iface
        e = {"NCCL_SOCKET_IFNAME": f"={iface}", "GLOO_SOCKET_IFNAME": iface}
        if backend == "ucx":
            ports = f.rdma_active_ports or [f"{d}:1" for d in f.rdma_devices]
            e["NCCL_IB_HCA"] = ",".join(sorted({p.split(":")[0] for p in ports}))
            e["UCX_TLS"] = tls
            e["UCX_NET_DEVICES"] = ",".join(ports)
        else:
            e["NCCL_IB_DISABLE"] = "1"
            e["UCX_TLS"] = tls
            e["UCX_NET_DEVICES"] = iface
        if len(f.gpus) > 1 and len(f.p2p_islands()) > 1:
            e["NCCL_P2P_DISABLE"] = "1"
            reasons.append(f"{n.host}: NCCL_P2P_DISABLE=1: GPUs cannot all peer "
                           f"(groups {f.p2p_islands()})")
        env[n.host] = e
    if chosen:  # `NCCL_SOCKET_IFNAME==eth0` reads like a typo: say what the first `=` is
        iface = next(iter(chosen.values()))
        reasons.append(f"NCCL_SOCKET_IFNAME=={iface} is meant: a value starting with `=` is NCCL's exact match (only "
                       f"`{iface}`; without it NCCL takes every interface whose name starts with `{iface}`)")
    return BackendChoice(backend, env, chosen, reasons, problems)
