"""A worker cut off (its link down: nothing answers, nothing refuses) is lost to the watcher well before Ray's GCS
marks it dead. On real verl across two namespace hosts the GCS took 66 s (5 missed health checks of 3 s + a 10 s
timeout each); the watcher now asks the head when a raylet port it reached before stops answering."""

import subprocess
import time

import pytest

from tests.harness.ray_cluster import running_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cut(module_lab):
    lab = module_lab
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    with running_cluster(lab, head, [w1], name=f"cut{lab.n}") as path:
        yield lab, path, head, w1


def test_silence_from_a_port_never_reached_proves_nothing(cut, monkeypatch):
    """A raylet port this machine never reached (a firewall between the user's laptop and the workers) is no
    evidence: the head is not even asked."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.watch import detect

    lab, path, head, w1 = cut
    mon = detect.NodeMonitor(load_cluster(path))
    monkeypatch.setattr(detect, "_port_state", lambda ip, port, timeout=1.0: "silent")
    asked = []
    monkeypatch.setattr(mon, "_head_reaches", lambda ip, port: asked.append(ip) or False)
    try:
        for _ in range(detect.SILENT_LOOKS + 2):
            assert mon.lost({head.ip, w1.ip}) is None
        assert asked == []
    finally:
        mon.close()


def test_a_worker_whose_link_is_down_is_lost_within_seconds(cut):
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.watch.detect import NodeMonitor

    lab, path, head, w1 = cut
    spec = load_cluster(path)
    mon = NodeMonitor(spec)
    try:
        expected = {head.ip, w1.ip}
        assert mon.lost(expected) is None  # both up; w1's raylet port answers from here
        veth = f"{lab.prefix}v{lab.hosts.index(w1)}"
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        t0, found = time.monotonic(), None
        while found is None and time.monotonic() - t0 < 40:
            found = mon.lost(expected)
            time.sleep(0.5)
        took = time.monotonic() - t0
        assert found is not None and found[0] == w1.ip, found
        assert "from the head" in found[1] and took < 20, (took, found)
        assert spec.head_ip not in found[0]
    finally:
        subprocess.run(["ip", "link", "set", f"{lab.prefix}v{lab.hosts.index(w1)}", "up"], check=False)
        mon.close()

