"""Backend and interface selection from recorded facts (no network)."""

from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.diagnostics.backend import pick_interface, select_backend
from verl_cluster.facts.model import Interface, NodeFacts, from_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "facts"


def facts(name: str, host: str | None = None) -> NodeFacts:
    f = from_json(NodeFacts, (FIXTURES / f"{name}.json").read_text())
    return replace(f, host=host) if host else f


def spec(tmp_path, head="10.0.0.1", workers=("10.0.0.5",), extra=""):
    text = f"cluster_name: t\nhead:\n  host: {head}\nworkers:\n" + "".join(f"  - host: {w}\n" for w in workers)
    path = tmp_path / "cluster.yaml"
    path.write_text(text + extra)
    return load_cluster(path)


def test_rdma_everywhere_picks_ucx_with_hca_and_tls(tmp_path):
    s = spec(tmp_path)
    f = {"10.0.0.1": facts("rdma_ucx", "10.0.0.1"), "10.0.0.5": facts("rdma_ucx", "10.0.0.5")}
    head = f["10.0.0.1"]
    ifaces = [replace(i, addresses=["10.0.0.1/24"]) if i.name == "ib0" else i for i in head.interfaces]
    f["10.0.0.1"] = replace(head, route_to_head="lo", interfaces=ifaces)  # the head routes its own address over lo
    c = select_backend(s, f)
    assert c.backend == "ucx"
    env = c.env["10.0.0.5"]
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert env["UCX_TLS"] == "rc,ud,dc,sm,self"
    assert "NCCL_IB_DISABLE" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "=ib0" and env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert c.interfaces["10.0.0.1"] == "ib0"  # holds the head address
    assert any(r.startswith("ucx: every node has an RDMA device") for r in c.reasons)


def test_one_node_without_rdma_falls_back_to_tcp_and_says_which(tmp_path):
    s = spec(tmp_path, workers=("10.0.0.5", "10.0.0.2"))
    f = {"10.0.0.1": facts("rdma_ucx", "10.0.0.1"), "10.0.0.5": facts("rdma_ucx", "10.0.0.5"),
         "10.0.0.2": facts("rtx4090x8_no_p2p", "10.0.0.2")}
    c = select_backend(s, f)
    assert c.backend == "tcp"
    assert "tcp: no RDMA device on 10.0.0.2" in c.reasons
    assert all(e["NCCL_IB_DISABLE"] == "1" and e["UCX_TLS"] == "tcp,sm,self" for e in c.env.values())
    assert c.problems == []  # auto: falling back is fine


def test_forced_ucx_without_rdma_is_a_problem(tmp_path):
    s = spec(tmp_path, extra="network:\n  backend: ucx\n")
    f = {"10.0.0.1": facts("rdma_ucx", "10.0.0.1"), "10.0.0.5": facts("h200x2", "10.0.0.5")}
    c = select_backend(s, f)
    assert c.backend == "tcp"
    assert [p[0] for p in c.problems] == ["10.0.0.5"]
    assert "no RDMA device" in c.problems[0][1]


def test_ucx_without_rdma_transport_is_tcp(tmp_path):
    s = spec(tmp_path)
    no_verbs = replace(facts("rdma_ucx", "10.0.0.5"), ucx_transports=["self", "tcp", "posix"])
    c = select_backend(s, {"10.0.0.1": facts("rdma_ucx", "10.0.0.1"), "10.0.0.5": no_verbs})
    assert c.backend == "tcp"
    assert "UCX has no RDMA transport" in c.reasons[0]


def test_gpus_that_cannot_peer_get_p2p_disabled_only_there(tmp_path):
    s = spec(tmp_path, head="10.0.0.1", workers=("10.0.0.2",))
    f = {"10.0.0.1": facts("h200x2", "10.0.0.1"), "10.0.0.2": facts("rtx4090x8_no_p2p", "10.0.0.2")}
    c = select_backend(s, f)
    assert c.env["10.0.0.2"]["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" not in c.env["10.0.0.1"]
    assert any("NCCL_P2P_DISABLE=1" in r and "10.0.0.2" in r for r in c.reasons)


def test_route_over_docker_bridge_prefers_real_nic_on_head_subnet():
    f = NodeFacts("w", interfaces=[Interface("docker0", ["10.0.0.7/24"], kind="bridge"),
                                   Interface("enp1s0", ["10.0.0.8/24"], kind="ether")], route_to_head="docker0")
    assert pick_interface(f, "10.0.0.1", "10.0.0.8") == \
        ("enp1s0", "enp1s0: on head subnet of 10.0.0.1 (route uses docker0, a bridge)")


def test_veth_that_is_the_only_route_is_kept():
    f = NodeFacts("w", interfaces=[Interface("eth0", ["10.1.0.8/24"], kind="veth")], route_to_head="eth0")
    assert pick_interface(f, "10.1.0.1", "10.1.0.8") == ("eth0", "eth0: only route to head 10.1.0.1")


def test_no_route_to_head_is_a_problem(tmp_path):
    s = spec(tmp_path)
    lost = replace(facts("h200x2", "10.0.0.5"), route_to_head=None,
                   interfaces=[Interface("eth0", ["192.168.9.9/24"])])
    c = select_backend(s, {"10.0.0.1": facts("h200x2", "10.0.0.1"), "10.0.0.5": lost})
    assert c.problems and c.problems[0][0] == "10.0.0.5" and "no route to head 10.0.0.1" in c.problems[0][1]
    assert "10.0.0.5" not in c.env


@pytest.mark.parametrize("name,ok", [("eth0", True), ("eth9", False)])
def test_configured_interface_must_exist(tmp_path, name, ok):
    s = spec(tmp_path, extra=f"network:\n  interface: {name}\n")
    c = select_backend(s, {"10.0.0.1": facts("h200x2", "10.0.0.1"), "10.0.0.5": facts("h200x2", "10.0.0.5")})
    assert (c.problems == []) is ok
    if ok:
        assert c.env["10.0.0.5"]["GLOO_SOCKET_IFNAME"] == "eth0"
    else:
        assert "network.interface `eth9` does not exist" in c.problems[0][1]


def test_unreachable_nodes_are_left_out(tmp_path):
    s = spec(tmp_path)
    c = select_backend(s, {"10.0.0.1": facts("h200x2", "10.0.0.1")})
    assert set(c.env) == {"10.0.0.1"}


def test_one_node_loopback_cluster_uses_lo(tmp_path):
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.diagnostics.backend import select_backend
    from verl_cluster.facts.model import Interface, NodeFacts

    p = tmp_path / "l.yaml"
    p.write_text("cluster_name: l\nhead: {host: localhost}\n")
    spec = load_cluster(p)
    facts = NodeFacts(host="localhost", route_to_head="lo",
                      interfaces=[Interface("lo", ["127.0.0.1/8"], kind="loopback"),
                                  Interface("eth0", ["192.0.2.2/24"], kind="ether")])
    choice = select_backend(spec, {"localhost": facts})
    assert choice.problems == [] and choice.interfaces == {"localhost": "lo"}
    assert choice.env["localhost"]["GLOO_SOCKET_IFNAME"] == "lo"
