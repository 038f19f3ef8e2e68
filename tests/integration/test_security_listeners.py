"""Every port our Ray listens on is pinned by the config, and the ones that run code refuse a client without the
token: a real cluster on namespace hosts, asked by `check`."""

import json
import os
import subprocess
import sys

import pytest

from tests.harness.ray_cluster import running_cluster
from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster

pytestmark = pytest.mark.integration


def test_every_listener_is_pinned_and_code_ports_refuse_without_token(lab, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    with running_cluster(lab, head, [w1], name="listen") as cfg:
        # a Ray Client session held open while check looks: it brings listeners of its own
        def connect():
            return subprocess.Popen(
                [sys.executable, "-c", f"import ray, sys, time; ray.init('ray://{head.ip}:10001'); "
                                       "print(ray.get(ray.remote(lambda: 'up').remote()), flush=True); time.sleep(120)"],
                stdout=subprocess.PIPE, stderr=open(tmp_path / "client.err", "w"), text=True,
                env={**os.environ, "RAY_AUTH_MODE": "token",
                     "RAY_AUTH_TOKEN_PATH": str(load_cluster(cfg).token_file)})

        client = connect()
        if client.stdout.readline().strip() != "up":
            # Ray's client proxy starts a server per session and, on a loaded 2-core machine, sometimes gives up
            # on it ("Starting Ray client server failed"): once more, as a user would, before this counts
            err = (tmp_path / "client.err").read_text()
            client.kill()
            client.wait(10)
            assert "Starting Ray client server failed" in err, err[-3000:]
            client = connect()
            assert client.stdout.readline().strip() == "up", (tmp_path / "client.err").read_text()[-3000:]
        try:
            rc = main(["check", "-c", str(cfg), "--quick", "--json"])
            rep = json.loads(capsys.readouterr().out)
        finally:
            client.kill()
            client.wait(10)
    assert rc == 0, rep["problems"]
    rows = rep["listeners"]
    assert set(rows) == {head.ip, w1.ip}
    by_name = {}
    for host, listeners in rows.items():
        for r in listeners:
            assert r["name"] is not None, f"{host}: port {r['port']} ({r['process']}) is not pinned"
            by_name.setdefault((host, r["name"]), []).append(r)
    h = head.ip
    # the head's Prometheus endpoints moved from Ray's 44217/44227 to the pinned ports
    assert {r["port"] for r in by_name[(h, "dashboard_metrics")]} == {6705}
    assert {r["port"] for r in by_name[(h, "autoscaler_metrics")]} == {6706}
    assert not any(r["port"] in (44217, 44227) for rs in rows.values() for r in rs)
    # what runs code refuses a client without the token
    assert all(r["answer"] == "refused (HTTP 401)" for r in by_name[(h, "dashboard")])  # the Jobs API
    assert all(r["address"] == "127.0.0.1" for r in by_name[(h, "dashboard")])  # dashboard_host: loopback
    for name in ("gcs", "ray_client"):
        assert all(r["answer"] == "refused (gRPC UNAUTHENTICATED)" for r in by_name[(h, name)]), name
    for host in (h, w1.ip):
        agent = by_name[(host, "dashboard_agent_listen")]  # its HTTP API takes jobs
        assert all(r["answer"] == "refused (HTTP 401)" for r in agent), [r["answer"] for r in agent]
        for name in ("node_manager", "dashboard_agent_grpc"):
            assert all(r["answer"] == "refused (gRPC UNAUTHENTICATED)" for r in by_name[(host, name)]), name
    # the metrics endpoints answer (read-only Prometheus text): listed as such, not flagged
    assert by_name[(h, "metrics_export")][0]["answer"] == "answers (HTTP 200)"
    assert not [p for p in rep["problems"] if "answers without the token" in p["what"]]
    assert not [p for p in rep["problems"] if "not pinned" in p["what"]]
    sessions = by_name.get((h, "ray_client_session"), [])
    assert sessions and all(r["address"] in ("127.0.0.1", "::ffff:127.0.0.1") for r in sessions), sessions
