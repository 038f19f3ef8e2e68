"""Start-command building, fingerprints, dry-run output, node-side process matching, status rendering."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.harness.wait import wait_for
from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.nodes import node_script
from verl_cluster.lifecycle.commands import plan_start
from verl_cluster.nodes.agent import index_by_ip
from verl_cluster.lifecycle.status import ClusterStatus, NodeState, NodeStatus

ROOT = Path(__file__).resolve().parents[2]


def spec(tmp_path, extra=""):
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: c\nhead: {host: 10.9.0.1}\nworkers: [{host: 10.9.0.2, gpus: 4}]\n"
                 "ray: {ray_executable: /opt/venv/bin/ray, object_store_memory: 1000}\n" + extra)
    return load_cluster(p)


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


def test_head_and_worker_commands(tmp_path):
    head, worker = plan_start(spec(tmp_path))
    assert head.argv[:3] == ("/opt/venv/bin/ray", "start", "--head")
    assert arg(head.argv, "--node-ip-address") == "10.9.0.1"
    assert arg(head.argv, "--dashboard-host") == "127.0.0.1"  # loopback by default, never 0.0.0.0
    assert arg(head.argv, "--port") == "6379"
    assert arg(worker.argv, "--address") == "10.9.0.1:6379"
    assert arg(worker.argv, "--num-gpus") == "4" and worker.expected_gpus == 4
    for c in (head, worker):
        # every port Ray would pick at random is pinned
        for flag in ("--node-manager-port", "--object-manager-port", "--min-worker-port", "--max-worker-port",
                     "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port", "--metrics-export-port",
                     "--runtime-env-agent-port"):
            assert flag in c.argv
        assert arg(c.argv, "--temp-dir") == f"/tmp/vc-{os.getuid()}/c"
        assert c.env["RAY_AUTH_MODE"] == "token" and c.env["RAY_AUTH_TOKEN_PATH"].endswith("c/auth_token")


def test_network_and_env_pass_through(tmp_path):
    head, _ = plan_start(spec(tmp_path, "network: {interface: eth1, backend: tcp}\n"),
                         node_env={"10.9.0.1": {"UCX_TLS": "tcp"}})
    assert head.env["NCCL_SOCKET_IFNAME"] == "eth1" and head.env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert head.env["NCCL_IB_DISABLE"] == "1" and head.env["UCX_TLS"] == "tcp"


def test_fingerprint_ignores_token_location_but_not_config(tmp_path):
    a = plan_start(spec(tmp_path), token_paths={"10.9.0.1": "/home/a/.verl-cluster/c/auth_token"})[0]
    b = plan_start(spec(tmp_path), token_paths={"10.9.0.1": "/root/.verl-cluster/c/auth_token"})[0]
    assert a.fingerprint == b.fingerprint
    c = plan_start(load_cluster(ROOT / "cluster_configs/reference.yaml", ["ray.object_store_memory=5"]))[0]
    d = plan_start(load_cluster(ROOT / "cluster_configs/reference.yaml", ["ray.object_store_memory=6"]))[0]
    assert c.fingerprint != d.fingerprint


def test_masked_env_hides_secrets(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("cluster_name: c\nhead: {host: 10.9.0.1}\n"
                 "ray:\n  ray_executable: /r\n  env: {HF_TOKEN: hf_abc, WANDB_API_KEY: k1}\n")
    cmd = plan_start(load_cluster(p))[0]
    shown = json.dumps(cmd.to_json())
    assert "hf_abc" not in shown and "k1" not in shown and "RAY_AUTH_TOKEN_PATH" in shown


def test_dashboard_all_and_private(tmp_path):
    assert arg(plan_start(spec(tmp_path, "security: {dashboard_host: private}\n"))[0].argv,
               "--dashboard-host") == "10.9.0.1"
    assert arg(plan_start(spec(tmp_path, "security: {dashboard_host: all}\n"))[0].argv,
               "--dashboard-host") == "0.0.0.0"
    assert "RAY_AUTH_TOKEN_PATH" not in plan_start(spec(tmp_path, "security: {auth: none}\n"))[0].env


def test_dry_run_cli_json(tmp_path, capsys):
    p = tmp_path / "d.yaml"
    p.write_text("cluster_name: d\nhead: {host: 10.9.0.1}\nworkers: [{host: 10.9.0.2}]\n")
    assert main(["up", str(p), "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["role"] for n in data["nodes"]] == ["head", "worker"]
    assert data["nodes"][1]["argv"][1:4] == ["start", "--address", "10.9.0.1:6379"]


def descendants(pid):
    return node_script.with_descendants({pid}, node_script.read_procs(), set()) - {pid}


def test_node_script_matches_only_its_temp_dir(tmp_path):
    """`ours` finds processes naming this temp dir and their children, never another cluster's."""
    mine = subprocess.Popen(["sh", "-c", f"sleep 30 & wait # --temp-dir={tmp_path}/vc-a"])
    other = subprocess.Popen(["sh", "-c", f"sleep 30 # --temp-dir={tmp_path}/vc-ab"])
    try:  # a loaded machine may take its time to fork: wait for the child, not a fixed 0.3 s
        wait_for(lambda: len(descendants(mine.pid)) == 1, 10, "the shell's sleep")
        found = node_script.ours(f"{tmp_path}/vc-a")
        assert mine.pid in found and other.pid not in found
        assert len(found) == 2  # the shell and its sleep child
        assert os.getpid() not in found
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_node_script_kill_stops_children(tmp_path):
    src = Path(node_script.__file__).read_text()
    victim = subprocess.Popen(["sh", "-c", f"sleep 60 & sleep 60 & wait # {tmp_path}/vc-k/session_x"])
    bystander = subprocess.Popen(["sleep", "60"])
    wait_for(lambda: len(descendants(victim.pid)) == 2, 10, "the victim's two sleeps")
    out = subprocess.run([sys.executable, "-c", src, "kill", f"{tmp_path}/vc-k"], capture_output=True, text=True)
    data = json.loads(out.stdout.strip().splitlines()[-1].split("@@VC-JSON@@")[1])
    assert data["stopped"] == 3 and data["left"] == []
    assert victim.wait(5) is not None
    assert bystander.poll() is None
    bystander.kill()
    bystander.wait()


def test_index_by_ip_prefers_live_and_finds_loopback_head():
    nodes = [{"ip": "10.0.0.2", "alive": False, "start_time_ms": 5, "node_id": "old", "is_head": False},
             {"ip": "10.0.0.2", "alive": True, "start_time_ms": 1, "node_id": "new", "is_head": False},
             {"ip": "192.0.2.2", "alive": True, "start_time_ms": 1, "node_id": "h", "is_head": True}]
    idx = index_by_ip(nodes, "127.0.0.1")
    assert idx["10.0.0.2"]["node_id"] == "new" and idx["127.0.0.1"]["node_id"] == "h"


def test_status_json_and_health():
    st = ClusterStatus("c", "10.0.0.1:6379", "http://127.0.0.1:8265", nodes=[
        NodeStatus("10.0.0.1", "head", "10.0.0.1", NodeState.ALIVE, gpus=8.0, ray_version="2.60.0"),
        NodeStatus("10.0.0.2", "worker", "10.0.0.2", NodeState.DEAD, reason="raylet is not running")])
    d = st.to_json()
    assert d["healthy"] is False
    assert d["nodes"][0]["gpus"] == 8 and d["nodes"][0]["alive"] is True
    assert {"host", "role", "alive", "gpus", "ray_version"} <= set(d["nodes"][1])
    assert [n["state"] for n in d["nodes"]] == ["alive", "dead"] and type(d["nodes"][1]["state"]) is str
    st.nodes[1].state = NodeState.ALIVE
    assert st.healthy


def test_node_script_finds_the_client_server_by_gcs_address():
    procs = {10: (1, "/venv/bin/python3 -m ray.util.client.server --address=10.0.0.1:6379 --port=10001"),
             11: (1, "/venv/bin/python3 -m ray.util.client.server --address=10.0.0.1:7379 --port=10001"),
             12: (1, "raylet --temp_dir=/tmp/vc-a --node_ip_address=10.0.0.1 --node_id=abc1"),
             13: (1, "/venv/bin/python3 -m ray.util.client.server --address=192.0.2.2:6379 --node-id=abc1"),
             14: (1, "/venv/bin/python3 -m ray.util.client.server --address=192.0.2.2:7379 --node-id=def2")}
    found = node_script.ours("/tmp/vc-a", procs, gcs_address="10.0.0.1:6379")
    assert set(found) == {10, 12, 13}


def test_a_plain_ray_at_the_clusters_address_is_not_ours():
    """A `ray start --head` of someone else's at the address the cluster file names: none of its processes carry our
    temp dir, so its client server (which names only the GCS address) is not ours either: `down` leaves it be."""
    procs = {20: (1, "gcs_server --gcs_server_port=6379 --node-ip-address=10.0.0.1 --session-dir=/tmp/ray/s1"),
             21: (1, "raylet --temp_dir=/tmp/ray --node_ip_address=10.0.0.1 --node_id=fff9"),
             22: (1, "/venv/bin/python3 -m ray.util.client.server --address=10.0.0.1:6379 --port=10001")}
    assert node_script.ours("/tmp/vc-a", procs, gcs_address="10.0.0.1:6379") == {}


def test_override_without_cluster_file_uses_the_default(capsys):
    assert main(["up", "ray.object_store_memory=209715200", "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cluster"] == "local" and "209715200" in data["nodes"][0]["argv"]


def test_overrides_may_follow_options(capsys):
    assert main(["up", "cluster_configs/local.yaml", "--dry-run", "ray.object_store_memory=209715200", "--json"]) == 0
    assert "209715200" in json.loads(capsys.readouterr().out)["nodes"][0]["argv"]
    assert main(["up", "--dry-run", "--bogus"]) == 2


def test_node_without_the_configured_python_is_failed_not_unreachable(tmp_path, capsys):
    p = tmp_path / "np.yaml"
    p.write_text("cluster_name: np\nhead: {host: localhost}\nray: {ray_executable: /nonexistent/venv/bin/ray}\n"
                 f"security: {{token_file: {tmp_path}/tok}}\n")
    assert main(["up", str(p), "--json"]) == 1
    node = json.loads(capsys.readouterr().out)["nodes"][0]
    assert node["action"] == "failed" and "not found" in node["reason"]
    assert main(["status", str(p), "--json"]) == 1
    st = json.loads(capsys.readouterr().out)["nodes"][0]
    assert st["state"] == "missing" and "/nonexistent/venv/bin/python" in st["reason"]
