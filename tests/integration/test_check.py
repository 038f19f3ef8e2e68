"""`check` on namespace hosts with real sshd (and, for the collective, a real Ray cluster from `up`)."""

import json
import time
from pathlib import Path

import pytest

from tests.harness.cli import run_cli
from verl_cluster.config.cluster import load_cluster
from verl_cluster.diagnostics.check import CheckOptions, run_check
from verl_cluster.facts.measured_bus import recorded
from verl_cluster.facts.model import NodeFacts, from_dict
from verl_cluster.placement.hardware import hardware_from_facts, with_bus

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 120) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    p = run_cli(*args, timeout=timeout)
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"stderr": p.stderr}), \
        time.monotonic() - t0


def test_port_dropped_in_one_namespace_is_named_and_exits_1(lab):
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    # a firewall inside w1 only: the raylet port silently dropped, as a cloud security group does
    r = w1.run(["iptables", "-A", "INPUT", "-p", "tcp", "--dport", "6700", "-j", "DROP"])
    assert r.returncode == 0, r.stderr
    rc, report, seconds = cli("check", str(lab.cluster_yaml(head, [w1])), "--json", "--quick",
                              "--connect-timeout", "2")
    assert rc == 1, report
    assert seconds < 30  # the connect timeout bounds it; never a hang
    assert report["ports"], report["problems"]
    blocked = report["ports"]["blocked"]
    assert [(b["src"], b["dst"], b["port"], b["state"]) for b in blocked] == [(head.ip, w1.ip, 6700, "timeout")], \
        report["problems"]
    (p,) = [p for p in report["problems"] if p["severity"] == "error"]
    assert p["node"] == f"{head.ip} -> {w1.ip}"
    assert "TCP 6700 (node_manager)" in p["what"] and p["fix"] == f"open TCP 6700 from {head.ip} to {w1.ip}"


def test_interface_that_reaches_the_head_is_chosen(lab):
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    # a second link that sorts first, is up and has an address, but reaches nothing (a veth pair inside w1:
    # lab.add_interface makes a dummy link, and this kernel has no dummy driver)
    for argv in (["ip", "link", "add", "aaa0", "type", "veth", "peer", "name", "aaa1"],
                 ["ip", "addr", "add", "10.99.0.2/24", "dev", "aaa0"],
                 ["ip", "link", "set", "aaa0", "up"], ["ip", "link", "set", "aaa1", "up"]):
        r = w1.run(argv)
        assert r.returncode == 0, r.stderr
    spec = load_cluster(lab.cluster_yaml(head, [w1]))
    report = run_check(spec, quick=True)
    assert report.ok, report.problems
    assert report.choice.interfaces == {head.ip: "eth0", w1.ip: "eth0"}
    assert f"{w1.ip}: eth0: only route to head {head.ip}" in report.choice.reasons
    assert report.choice.env[w1.ip]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert report.choice.env[w1.ip]["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert {i.name for i in report.facts[w1.ip].interfaces} >= {"aaa0", "eth0", "lo"}
    assert report.matrix is not None and report.matrix.blocked() == [] and not report.matrix.live


def test_unreachable_node_is_named_and_the_others_still_checked(lab):
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    lab.stop_sshd(w1)
    rc, report, _ = cli("check", str(lab.cluster_yaml(head, [w1])), "--json", "--quick")
    assert rc == 1
    assert list(report["unreachable"]) == [w1.ip]
    assert any(p["node"] == w1.ip and p["what"].startswith("unreachable: SSH connection") for p in report["problems"])
    assert head.ip in report["facts"]


def test_live_cluster_links_ucx_over_tcp_and_gloo_allreduce(lab):
    from verl_cluster.diagnostics.backend import select_backend
    from verl_cluster.diagnostics.gather import gather_facts
    from verl_cluster.lifecycle.down import down
    from verl_cluster.lifecycle.up import up

    pytest.importorskip("torch")
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    spec = load_cluster(lab.cluster_yaml(head, [w1]))
    choice = select_backend(spec, gather_facts(spec))  # what `up` gets: the env its Ray workers inherit
    assert up(spec, node_env=choice.env).healthy
    try:
        report = run_check(spec, options=CheckOptions(ucx=True, stream_seconds=0.5))
    finally:
        down(spec)
    assert report.ok, report.problems
    assert report.matrix.live and report.matrix.blocked() == []
    (link,) = report.links
    assert link.bandwidth_gbps > 0.5 and 0 < link.latency_ms < 50
    (ucx,) = report.ucx_links
    assert ucx.error is None and ucx.ucx_bandwidth_gbps > 0.1
    (gloo,) = report.collectives
    assert gloo.backend == "gloo" and gloo.ok and gloo.world == 2
    assert [r["size"] for r in gloo.results] == [1 << 20, 16 << 20]
    assert all(r["correct"] and r["busbw_gbs"] == pytest.approx(r["algbw_gbs"]) for r in gloo.results)  # n=2
    data = report.to_json()
    assert data["links"][0]["src"] == link.src and data["env"][w1.ip]["NCCL_IB_DISABLE"] == "1"
    # the gloo figure is kept with the cluster's state, and the planner does not charge FSDP traffic at it
    (kept,) = [m for m in recorded(spec.cluster_name) if m.backend == "gloo"]
    assert (kept.nodes, kept.gpus, kept.size_bytes) == (2, 0, 16 << 20) and time.time() - kept.measured_at < 600
    assert kept.busbw_gbs == pytest.approx(gloo.results[-1]["busbw_gbs"])
    facts = json.loads((ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    hw = with_bus(hardware_from_facts([from_dict(NodeFacts, facts)]), recorded(spec.cluster_name))
    assert hw.measured_bus_gbs is None and any("gloo (CPU) all-reduce only: not used" in n for n in hw.notes)
