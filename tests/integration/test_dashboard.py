"""`dashboard` (an SSH tunnel to the head's loopback dashboard, held until Ctrl-C), `status` pointing at it, and
what `submit`/`logs` print (Ray's client INFO lines only with --debug; the cluster found from the job's local
record). The session's real two-node Ray cluster on namespace hosts with real sshd; a real SIGINT to a real CLI process."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.harness.cli import ctrl_c_default, run_cli
from verl_cluster.config.cluster import load_cluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
cli = run_cli


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    return shared_cluster.lab, shared_cluster.path, shared_cluster.token


class Dashboard:
    """`verl-cluster dashboard ...` running in the background, its output collected as it comes."""

    def __init__(self, *args, env=None):
        self.p = subprocess.Popen([sys.executable, "-m", "verl_cluster", "dashboard", *map(str, args)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                  preexec_fn=ctrl_c_default)
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(s), daemon=True).start()

    def wait_open(self, timeout=30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any("tunnel open" in x for x in self.err):
            assert self.p.poll() is None, "".join(self.err)[-2000:]
            time.sleep(0.1)
        assert any("tunnel open" in x for x in self.err), "".join(self.err)[-2000:]

    def interrupt(self) -> int:
        self.p.send_signal(signal.SIGINT)
        rc = self.p.wait(15)
        time.sleep(0.2)  # the readers finish
        return rc

    @property
    def text(self) -> str:
        return "".join(self.out + self.err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tunnel_answers_with_the_token_refuses_without_and_ctrl_c_exits_0(cluster):
    _, path, token = cluster
    d = Dashboard("-c", path, "--json")
    d.wait_open()
    doc = json.loads(d.out[0])
    url = doc["url"]
    assert doc["tunnel"] and doc["token_accepted"] is True and url.startswith("http://127.0.0.1:")
    assert "token" not in doc and token not in d.text
    bearer = {"Authorization": f"Bearer {token}"}
    r = requests.get(f"{url}/api/version", headers=bearer, timeout=10)
    assert r.status_code == 200 and r.json()["ray_version"] == doc["ray_version"]
    assert requests.get(f"{url}/api/jobs/", headers=bearer, timeout=10).status_code == 200
    # the cookie the dashboard page sets after asking for the token once
    cookie = {"ray-authentication-token": token}
    assert requests.get(f"{url}/api/jobs/", cookies=cookie, timeout=10).status_code == 200
    assert requests.get(f"{url}/api/jobs/", timeout=10).status_code == 401
    assert requests.get(f"{url}/api/jobs/", headers={"Authorization": "Bearer " + "0" * 64},
                        timeout=10).status_code == 403
    assert d.interrupt() == 0, d.text
    assert "tunnel closed" in d.text and "Traceback" not in d.text
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/api/version", timeout=5)


def test_port_open_and_show_token(cluster, tmp_path):
    _, path, token = cluster
    port = free_port()
    opened = tmp_path / "opened"
    browser = tmp_path / "browser.sh"
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {opened}\n")
    browser.chmod(0o755)
    d = Dashboard("-c", path, "--port", port, "--open", env={"BROWSER": str(browser)})
    d.wait_open()
    assert f"http://127.0.0.1:{port}" in d.text and "Authorization: Bearer" in d.text
    assert "ray-authentication-token" in d.text and token not in d.text  # how to pass it, never the token
    for _ in range(50):
        if opened.exists():
            break
        time.sleep(0.1)
    assert opened.read_text().strip() == f"http://127.0.0.1:{port}"
    # the same port again while it is held: a clear bad-input error
    busy = cli("dashboard", "-c", path, "--port", port, timeout=60)
    assert busy.returncode == 2 and f"--port {port}" in busy.stderr and "Traceback" not in busy.stderr
    assert d.interrupt() == 0
    shown = Dashboard("-c", path, "--show-token", "--json")
    shown.wait_open()
    assert json.loads(shown.out[0])["token"] == token
    assert shown.interrupt() == 0


def test_head_down_is_a_clear_error_within_the_connect_timeout(cluster, tmp_path):
    lab, path, _ = cluster
    gone = tmp_path / "gone.yaml"  # a head address where no host answers
    gone.write_text(Path(path).read_text().replace(f"host: {lab.subnet}.10", f"host: {lab.subnet}.99"))
    t0 = time.monotonic()
    r = cli("dashboard", "-c", gone, "ssh.connect_timeout_s=2", timeout=60)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 20
    assert f"{lab.subnet}.99" in r.stderr and "Traceback" not in r.stderr


def test_sshd_up_but_no_dashboard_is_a_clear_error(cluster):
    lab, path, _ = cluster
    bare = lab.add_host("bare")  # SSH works, Ray is not running there
    other = lab.cluster_yaml(bare, [], name=f"bare{lab.n}")
    Path(load_cluster(other).token_file).write_text("0" * 64 + "\n")
    r = cli("dashboard", "-c", other, timeout=60)
    assert r.returncode == 1 and "not answering" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_status_prints_the_dashboard_command(cluster):
    _, path, _ = cluster
    r = cli("status", "-c", path)
    assert r.returncode == 0, r.stderr
    assert f"verl-cluster dashboard -c {path}" in r.stdout
    st = json.loads(cli("status", path, "--json").stdout)
    assert st["dashboard_on_head_only"] and st["dashboard_command"] == f"verl-cluster dashboard -c {path}"


def test_submit_and_logs_are_quiet_and_logs_finds_the_cluster_from_the_job(cluster, tmp_path):
    _, path, _ = cluster
    home = {"HOME": str(tmp_path)}  # the job records go to $HOME/.verl-cluster/jobs
    r = cli("submit", ROOT / "launch/smoke.yaml", "-c", path, env=home)
    assert r.returncode == 0, r.stderr[-3000:]
    noise = ("dashboard_sdk.py", "Uploading package", "sdk.py:", "WebSocket closed", "packaging.py")
    assert not [n for n in noise if n in r.stdout + r.stderr], r.stdout + r.stderr
    sid = next(w for w in r.stderr.split() if w.startswith("smoke-"))
    assert (tmp_path / ".verl-cluster/jobs" / f"{sid}.json").is_file()
    # no -c: the cluster comes from the job's record
    logs = cli("logs", sid, "--follow", env=home)
    assert logs.returncode == 0 and "SMOKE OK" in logs.stdout, logs.stderr
    assert not [n for n in noise if n in logs.stdout + logs.stderr], logs.stdout + logs.stderr
    jobs = cli("jobs", "--json", env=home)  # no -c: every cluster submitted to from here
    assert jobs.returncode == 0, jobs.stderr
    listed = json.loads(jobs.stdout)["clusters"]
    assert any(j["submission_id"] == sid for c in listed for j in c.get("jobs", [])), jobs.stderr
    # --debug keeps Ray's own lines
    dbg = cli("submit", ROOT / "launch/smoke.yaml", "-c", path, "--debug", env=home)
    assert dbg.returncode == 0 and "dashboard_sdk.py" in dbg.stdout + dbg.stderr, dbg.stderr[-3000:]
