"""The listener list of `check`: the node-side lister against real sockets of this process, the pinned metrics
ports in the head's start command, and which listeners become problems."""

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from verl_cluster.diagnostics import listeners_node
from verl_cluster.diagnostics.ports import _client_session, listener_problems, port_name
from verl_cluster.lifecycle.commands import plan_start
from tests.unit.test_security_config import cluster


@pytest.fixture
def spec(tmp_path):
    return cluster(tmp_path, "head: {host: 10.9.0.1}\nworkers: [{host: 10.9.0.2}]\nray: {ray_executable: /v/bin/ray}\n")


def test_head_pins_the_dashboard_and_autoscaler_metrics_ports(spec):
    head, worker = plan_start(spec)
    assert head.env["DASHBOARD_METRIC_PORT"] == "6705" and head.env["AUTOSCALER_METRIC_PORT"] == "6706"
    assert "DASHBOARD_METRIC_PORT" not in worker.env
    assert port_name(spec, 6705) == "dashboard_metrics" and port_name(spec, 6706) == "autoscaler_metrics"
    assert port_name(spec, 44217) is None and port_name(spec, 12345) == "worker"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(self.server.code)
        self.end_headers()

    def log_message(self, *a):
        pass


def _serve(code, host="127.0.0.1"):
    srv = http.server.ThreadingHTTPServer((host, 0), _Handler)
    srv.code = code
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_node_lister_sees_bind_address_and_answer_of_real_sockets():
    locked, open_ = _serve(401), _serve(200, "0.0.0.0")
    try:
        script = listeners_node.__file__
        r = subprocess.run([sys.executable, script, str(os.getpid()), "0"], capture_output=True, text=True,
                           timeout=30)
        rows = json.loads(r.stdout.split(listeners_node.MARK, 1)[1])["listeners"]
    finally:
        locked.shutdown()
        open_.shutdown()
    by_port = {x["port"]: x for x in rows}
    a, b = by_port[locked.server_address[1]], by_port[open_.server_address[1]]
    assert (a["address"], a["answer"], a["open_without_token"]) == ("127.0.0.1", "refused (HTTP 401)", False)
    assert (b["address"], b["answer"], b["open_without_token"]) == ("0.0.0.0", "answers (HTTP 200)", True)
    assert a["pid"] == os.getpid()


def test_unpinned_or_open_code_ports_are_problems(spec):
    rows = {"10.9.0.1": [
        {"port": 6379, "address": "::", "process": "gcs_server", "name": "gcs", "answer": "refused", "open_without_token": False},
        {"port": 44217, "address": "0.0.0.0", "process": "monitor.py", "name": None, "answer": "answers (HTTP 200)",
         "open_without_token": True},
        {"port": 6703, "address": "0.0.0.0", "process": "agent", "name": "metrics_export", "answer": "answers (HTTP 200)",
         "open_without_token": True},
        {"port": 8265, "address": "0.0.0.0", "process": "dashboard.py", "name": "dashboard",
         "answer": "answers (HTTP 200)", "open_without_token": True},
        {"port": 52365, "address": "127.0.0.1", "process": "agent", "name": "dashboard_agent_listen",
         "answer": "answers (HTTP 200)", "open_without_token": True},
    ]}
    session = {"port": 23000, "address": "::ffff:127.0.0.1", "process": "ray.util.client.server", "pid": 1,
               "answer": "refused (gRPC UNAUTHENTICATED)", "protocol": "grpc", "open_without_token": False}
    assert _client_session(session) == "ray_client_session"
    assert _client_session({**session, "address": "0.0.0.0"}) is None  # off loopback it would be a finding
    found = listener_problems(spec, rows)
    assert [(n, w.split(" ")[1]) for n, w, _ in found] == [("10.9.0.1", "44217"), ("10.9.0.1", "8265")]
    assert "not pinned" in found[0][1] and "answers without the token" in found[1][1]
