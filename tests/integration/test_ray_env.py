"""Ray's own CLI on our cluster, and our `status` on a Ray we did not start (issue 32 item 7). The session's shared
two-node cluster (namespace hosts, real sshd, real Ray with token auth): `ray status` and `ray job list` run with what
`verl-cluster env` prints. A plain `ray start` on a namespace host: `status` names it and reads its nodes."""

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness.cli import ctrl_c_default, run_cli

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
RAY_VARS = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def exports(text: str) -> dict[str, str]:
    """What `eval` would set: each line is `export K=V`, V shell-quoted."""
    out = {}
    for line in text.splitlines():
        words = shlex.split(line)
        assert words[0] == "export" and len(words) == 2, line
        k, v = words[1].split("=", 1)
        out[k] = v
    return out


def ray_cli(*args, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
    return subprocess.run([RAY, *args], capture_output=True, text=True, timeout=timeout, env={**base, **env},
                          cwd="/")


def test_ray_status_and_ray_job_list_with_the_printed_exports(shared_cluster):
    r = run_cli("env", "-c", shared_cluster.path)
    assert r.returncode == 0, r.stderr
    env = exports(r.stdout)
    assert env["RAY_AUTH_MODE"] == "token" and Path(env["RAY_AUTH_TOKEN_PATH"]).is_file()
    assert env["RAY_ADDRESS"] == f"{shared_cluster.head.ip}:6379"  # the head's GCS answers from here
    # `ray status` through the exports: the cluster's nodes, no AuthenticationError (the traceback)
    deadline = time.monotonic() + 30  # Ray's autoscaler view lists a worker some seconds after it registered
    while True:
        st = ray_cli("status", env=env)
        assert st.returncode == 0 and "AuthenticationError" not in st.stdout + st.stderr, st.stdout + st.stderr
        if st.stdout.count("node_") >= 2 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert "Active:" in st.stdout and st.stdout.count("node_") >= 2, st.stdout
    # without the token, the same address is refused: what a user hit before
    bare = ray_cli("status", env={"RAY_ADDRESS": env["RAY_ADDRESS"]}, timeout=120)
    assert bare.returncode != 0, bare.stdout
    # `ray job list` goes through the tunnel `env` named on stderr; held by `verl-cluster dashboard`
    tunnel = r.stderr.split("keep this open in another terminal", 1)[1].splitlines()[1].split()
    assert tunnel[:4] == ["verl-cluster", "dashboard", "-c", str(shared_cluster.path)], r.stderr
    held = Held([sys.executable, "-m", "verl_cluster", *tunnel[1:]])
    try:
        held.wait_for("tunnel open")
        jobs = ray_cli("job", "list", env=env)
        assert jobs.returncode == 0 and "AuthenticationError" not in jobs.stdout + jobs.stderr, jobs.stderr
    finally:
        held.stop()


class Held:
    """A CLI process holding something open (a tunnel) in the background, its stderr collected."""

    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=ctrl_c_default)
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True).start()

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(text in x for x in self.err):
            assert self.p.poll() is None, "".join(self.err)
            time.sleep(0.1)
        assert any(text in x for x in self.err), "".join(self.err)

    def stop(self) -> None:
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()


def test_status_of_a_ray_not_started_by_verl_cluster(lab):
    """Before: every node 'missing' while `submit` to it worked."""
    host = lab.add_host("plain")
    started = host.run([RAY, "start", "--head", "--node-ip-address", host.ip, "--port", "6379", "--num-cpus", "1",
                        "--num-gpus", "0", "--object-store-memory", "209715200", "--dashboard-host", "127.0.0.1",
                        "--disable-usage-stats", "--temp-dir", "/tmp/plain-ray"], timeout=90)
    assert started.returncode == 0, started.stdout + started.stderr
    path = lab.cluster_yaml(host, [], name=f"plain{lab.n}")
    r = run_cli("status", "-c", path, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["other_ray"] is True, r.stdout + r.stderr
    [head] = doc["nodes"]
    assert head["state"] == "other-ray" and head["cpus"] == 1 and head["ray_version"], head
    assert "not started by verl-cluster" in head["reason"]
    r = run_cli("status", "-c", path)
    assert "a Ray not started by verl-cluster" in r.stdout and "missing" not in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr
