"""Two supported Ray versions at once, on real hosts: nodes that differ, and this machine's Ray against the cluster's.

The other Ray is the Python named by VC_OTHER_RAY_PYTHON (scripts/test.sh sets it: the oldest supported Ray when
pytest runs on the newest, and the other way round).
"""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.harness.cli import run_cli
from verl_cluster.diagnostics.ray_versions import SUPPORTED

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
THIS = version("ray")


@pytest.fixture(scope="module")
def other():
    """(path of the other `ray`, its version)."""
    py = os.environ.get("VC_OTHER_RAY_PYTHON")
    if not py:
        if os.environ.get("VC_REQUIRE_INTEGRATION") == "1":
            pytest.fail("VC_OTHER_RAY_PYTHON is not set: scripts/test.sh sets it to the other supported Ray's Python")
        pytest.skip("VC_OTHER_RAY_PYTHON is not set")
    v = subprocess.run([py, "-c", "from importlib.metadata import version; print(version('ray'))"],
                       capture_output=True, text=True, timeout=60).stdout.strip()
    assert v and v != THIS, f"{py} has Ray {v!r}; it must be another supported version than {THIS}"
    return str(Path(py).with_name("ray")), v


def cli_json(*args):
    r = run_cli(*args, "--json")
    return r.returncode, json.loads(r.stdout), r.stderr


def test_nodes_on_different_ray_are_named_with_the_fix(lab, other):
    other_ray, other_version = other
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    path = lab.cluster_yaml(head, [w1], node_ray={"w1": other_ray})

    rc, report, _ = cli_json("check", "-c", path, "--quick")
    assert rc == 1
    [p] = [p for p in report["problems"] if p["what"].startswith("ray differs")]
    assert p["what"] == f"ray differs between nodes: {head.ip}={THIS}, {w1.ip}={other_version}"
    assert "pip install 'ray[default]==" in p["fix"] and f"verl-cluster supports Ray {SUPPORTED}" in p["fix"]

    # up refuses the odd worker before `ray start` (Ray would refuse it anyway), with the fix; the head runs
    rc, up, err = cli_json("up", "-c", path)
    try:
        assert rc == 1 and "Traceback" not in err
        nodes = {n["host"]: n for n in up["nodes"]}
        assert nodes[head.ip]["action"] == "started"
        assert nodes[w1.ip]["action"] == "failed"
        assert nodes[w1.ip]["reason"].startswith(f"Ray {other_version} there, {THIS} on the head")
        assert f"pip install 'ray[default]=={THIS}'" in nodes[w1.ip]["reason"]
        assert w1.pids("raylet") == []

        rc, st, err = cli_json("status", "-c", path)
        assert rc == 1 and "Traceback" not in err
        assert any(p.startswith(f"ray differs between nodes: {head.ip}={THIS}, {w1.ip}={other_version}; fix: ")
                   for p in st["problems"]), st["problems"]
    finally:
        run_cli("down", "-c", path)


def test_this_machine_on_another_ray_than_the_cluster_submits_and_says_so(lab, other):
    """The CLI's Jobs SDK against a head of the other version: supported, said, and a job runs to the end."""
    other_ray, other_version = other
    head = lab.add_host("head")
    path = lab.cluster_yaml(head, [], ray=other_ray, extra="network:\n  interface: eth0\n")
    rc, up, err = cli_json("up", "-c", path)
    try:
        assert rc == 0, err[-2000:]
        assert any(p["node"] == "this machine" and p["severity"] == "warning" for p in up["check"]["problems"])
        rc, st, _ = cli_json("status", "-c", path)
        assert rc == 0 and st["client_ray_version"] == THIS and st["nodes"][0]["ray_version"] == other_version
        [p] = [p for p in st["problems"] if p.startswith("this machine:")]
        assert f"this machine's Ray {THIS} differs from the cluster's {other_version}: supported" in p

        r = run_cli("submit", ROOT / "launch/smoke.yaml", "-c", path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "SMOKE OK: 1 node(s)" in r.stdout and "SUCCEEDED" in r.stderr
        sid = next(line.split()[1] for line in r.stderr.splitlines() if line.startswith("submitted "))
        rc, doc, _ = cli_json("jobs", "-c", path)
        jobs = [j for c in doc["clusters"] for j in c["jobs"]]  # one shape, with -c as without (docs/cli.md)
        assert rc == 0 and any(j["submission_id"] == sid and j["status"] == "SUCCEEDED" for j in jobs), jobs
        logs = run_cli("logs", sid, "-c", path)
        assert logs.returncode == 0 and "SMOKE OK" in logs.stdout
    finally:
        run_cli("down", "-c", path)


def test_the_hosts_run_the_ray_beside_this_python(lab):
    """What makes the old-Ray pass real: the hosts' `ray` is the one of the venv that runs pytest."""
    head = lab.add_host("head")
    text = lab.cluster_yaml(head, []).read_text()
    assert f"ray_executable: {Path(sys.executable).with_name('ray')}" in text
    r = head.run([sys.executable, "-c", "import ray; print(ray.__version__)"])
    assert r.stdout.strip() == THIS
