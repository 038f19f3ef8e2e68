"""up / status / down on real hosts: network namespaces with real sshd and real Ray."""

import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.harness.cli import cli, cli_json
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import HostKeyError
from verl_cluster.runners import SshRunner, SshTarget

pytestmark = pytest.mark.integration
RAY = str(Path(sys.executable).with_name("ray"))
PY = sys.executable
RAY_VERSION = version("ray")  # the hosts run the Ray beside this Python: the oldest or the newest supported




def states(status):
    return {n["host"]: n["state"] for n in status["nodes"]}


def our_ray(host, temp_dir):
    return host.pids(f"temp.dir={temp_dir}")


def test_lifecycle_on_three_hosts(lab, capsys):
    head, w1, w2 = lab.add_host("head"), lab.add_host("w1"), lab.add_host("w2")
    cfg = lab.cluster_yaml(head, [w1, w2], name="life")
    spec = load_cluster(cfg)

    rc, rep = cli_json(capsys, "up", str(cfg))
    assert rc == 0, rep
    assert [n["action"] for n in rep["nodes"]] == ["started"] * 3

    rc, st = cli_json(capsys, "status", str(cfg))
    assert rc == 0 and st["healthy"]
    assert states(st) == {head.ip: "alive", w1.ip: "alive", w2.ip: "alive"}
    assert all(n["ray_version"] == RAY_VERSION and n["cpus"] > 0 for n in st["nodes"])

    # token file: 0600 here and on the nodes
    assert oct(spec.token_file.stat().st_mode & 0o777) == "0o600"
    r = w1.run(["stat", "-c", "%a", "/root/.verl-cluster/life/auth_token"])
    assert r.stdout.strip() == "600"

    # dashboard bound to the head's loopback only; the Jobs API refuses a request without the token
    token = spec.token_file.read_text().strip()
    probe = ("import sys,urllib.request as u\nreq=u.Request('http://127.0.0.1:8265/api/jobs/')\n"
             "if len(sys.argv)>1: req.add_header('Authorization','Bearer '+sys.argv[1])\n"
             "try: print(u.urlopen(req, timeout=10).status)\nexcept Exception as e: print(getattr(e,'code',e))")
    assert head.run([PY, "-c", probe]).stdout.strip() in ("401", "403")
    assert head.run([PY, "-c", probe, token]).stdout.strip() == "200"
    assert head.run([PY, "-c", probe.replace("127.0.0.1", head.ip)]).stdout.strip() not in ("200", "401", "403")

    # up again on a healthy cluster: verifies and changes nothing
    rc, rep = cli_json(capsys, "up", str(cfg))
    assert rc == 0 and [n["action"] for n in rep["nodes"]] == ["kept"] * 3

    # a worker's raylet dies: status says so, up heals it and leaves the others alone
    assert w1.run(["pkill", "-9", "-f", "raylet/raylet"]).returncode == 0
    rc, st = cli_json(capsys, "status", str(cfg))
    assert rc == 1 and not st["healthy"] and states(st)[w1.ip] == "dead"
    rc, rep = cli_json(capsys, "up", str(cfg))
    assert rc == 0, rep
    assert {n["host"]: n["action"] for n in rep["nodes"]} == {head.ip: "kept", w1.ip: "restarted", w2.ip: "kept"}
    rc, st = cli_json(capsys, "status", str(cfg))
    assert rc == 0 and st["healthy"]

    # a changed config is reported, not silently ignored; --restart applies it
    rc, rep = cli_json(capsys, "up", str(cfg), "ray.object_store_memory=209715201")
    assert rc == 1 and {n["action"] for n in rep["nodes"]} == {"changed"}
    # ... naming the setting (issue 32 item 3: it said "NOT healthy", "a different config")
    assert all("ray.object_store_memory 209715200 -> 209715201" in n["reason"] for n in rep["nodes"]), rep
    rc, rep = cli_json(capsys, "up", str(cfg), "ray.object_store_memory=209715201", "--restart")
    assert rc == 0 and {n["action"] for n in rep["nodes"]} == {"restarted"}, rep

    # the head dies: up restarts it and every worker rejoins the new head
    assert head.run(["pkill", "-9", "-f", "gcs_server"]).returncode == 0
    rc, st = cli_json(capsys, "status", str(cfg), "ray.object_store_memory=209715201")
    assert rc == 1 and states(st)[head.ip] == "dead"
    rc, rep = cli_json(capsys, "up", str(cfg), "ray.object_store_memory=209715201")
    assert rc == 0, rep
    assert [n["action"] for n in rep["nodes"]] == ["restarted"] * 3
    rc, st = cli_json(capsys, "status", str(cfg), "ray.object_store_memory=209715201")
    assert rc == 0 and st["healthy"] and len(st["extra_nodes"]) == 0

    # someone else's Ray on w2 (other temp dir, other ports) must survive our down
    other = w2.run([RAY, "start", "--head", "--node-ip-address", w2.ip, "--port", "7379", "--temp-dir", "/tmp/other",
                    "--dashboard-port", "9265", "--node-manager-port", "7700", "--object-manager-port", "7701",
                    "--dashboard-agent-grpc-port", "7702", "--dashboard-agent-listen-port", "7703",
                    "--metrics-export-port", "7704", "--runtime-env-agent-port", "7705", "--min-worker-port", "21000",
                    "--max-worker-port", "21100", "--ray-client-server-port", "7706", "--include-dashboard=false",
                    "--object-store-memory", "209715200", "--disable-usage-stats"],
                   env={"RAY_AUTH_MODE": "disabled"}, timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]
    others_before = w2.pids("temp.dir=/tmp/other")
    assert others_before

    rc, rep = cli_json(capsys, "down", str(cfg))
    assert rc == 0 and rep["ok"] and all(n["stopped"] > 0 for n in rep["nodes"])
    for h in (head, w1, w2):
        assert h.pids(f"temp.dir={spec.temp_dir}") == [] and h.pids(f"raylet.*{spec.temp_dir}") == []
    assert head.pids(f"ray.util.client.server --address={head.ip}:6379") == []
    assert set(others_before) <= set(w2.pids("temp.dir=/tmp/other")), "down killed a Ray it did not start"
    rc, st = cli_json(capsys, "status", str(cfg))
    assert rc == 1 and set(states(st).values()) == {"missing"}


def test_unreachable_worker_is_named_others_stay_up(lab, capsys):
    head, good, bad = lab.add_host("head"), lab.add_host("good"), lab.add_host("bad", sshd=False)
    cfg = lab.cluster_yaml(head, [good, bad], name="unr")
    temp_dir = load_cluster(cfg).temp_dir
    t0 = time.monotonic()
    rc, rep = cli_json(capsys, "up", str(cfg))
    assert rc == 1
    by = {n["host"]: n for n in rep["nodes"]}
    assert by[bad.ip]["action"] == "unreachable" and "refused" in by[bad.ip]["reason"]
    assert by[head.ip]["action"] == "started" and by[good.ip]["action"] == "started"
    assert time.monotonic() - t0 < 60
    rc, st = cli_json(capsys, "status", str(cfg))
    assert rc == 1 and states(st) == {head.ip: "alive", good.ip: "alive", bad.ip: "unreachable"}
    rc, out, err = cli(capsys, "up", str(cfg))  # the table names the host and the reason
    assert rc == 1 and bad.ip in out and "refused" in out
    rc, rep = cli_json(capsys, "down", str(cfg))
    assert rc == 1 and not rep["ok"]  # the unreachable host could not be verified
    assert head.pids(f"temp.dir={temp_dir}") == [] and good.pids(f"temp.dir={temp_dir}") == []


def test_unknown_host_key_is_refused_unless_trusted(lab, capsys, tmp_path):
    stranger = lab.add_host("stranger", known=False)
    cfg = lab.cluster_yaml(stranger, [], name="keys")
    rc, out, err = cli(capsys, "status", str(cfg))
    assert rc == 1 and "not in" in out and "known_hosts" in out

    # trust on first use, explicitly: the key is remembered, then verified (not re-added) next time
    kh = tmp_path / "kh"
    target = SshTarget(stranger.ip, user="root", key_file=str(lab.client_key), known_hosts_file=str(kh),
                       accept_new_host_keys=True)
    r = SshRunner(target)
    assert r.run(["true"]).rc == 0
    r.close()
    assert kh.read_text().count(stranger.ip) == 1
    assert SshRunner(SshTarget(**{**target.__dict__, "accept_new_host_keys": False})).run(["true"]).rc == 0
    # a changed key is refused even with accept_new_host_keys
    other = tmp_path / "otherkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh.write_text(f"{stranger.ip} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    with pytest.raises(HostKeyError, match="does not match"):
        SshRunner(target).run(["true"])
    assert kh.read_text().count(stranger.ip) == 1  # nothing was added


@pytest.fixture
def local_ports_lock():
    """The local cycle uses fixed ports in the root namespace: a second test run on this machine (test.sh runs the
    oldest-Ray pass beside the first) waits for it rather than meeting it."""
    import fcntl

    with open("/var/tmp/vc-local-cycle.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def test_local_cycle(tmp_path, capsys, local_ports_lock, monkeypatch):
    """cluster_configs/local.yaml as shipped, with ports moved so it cannot meet a Ray already here. `up` runs from
    a folder that is then removed: Ray's daemons run from the temp dir (a removed cwd made every Jobs API submit
    answer 500), and the bundle check's jobs below go through the Jobs API."""
    root = Path(__file__).resolve().parents[2]
    over = ["cluster_name=vctest", "head.gcs_port=6479", "head.dashboard_port=8365", "head.ray_client_port=10101",
            "ray.ports.node_manager=6800", "ray.ports.object_manager=6801", "ray.ports.dashboard_agent_grpc=6802",
            "ray.ports.dashboard_agent_listen=52465", "ray.ports.metrics_export=6803",
            "ray.ports.runtime_env_agent=6804", "ray.ports.min_worker=20002", "ray.ports.max_worker=20999",
            "ray.object_store_memory=209715200", f"security.token_file={tmp_path}/token"]
    other = ["cluster_name=vctest2", "head.gcs_port=6489", "head.dashboard_port=8375", "head.ray_client_port=10111",
             "ray.ports.node_manager=6810", "ray.ports.object_manager=6811", "ray.ports.dashboard_agent_grpc=6812",
             "ray.ports.dashboard_agent_listen=52475", "ray.ports.metrics_export=6813",
             "ray.ports.runtime_env_agent=6814", "ray.ports.dashboard_metrics=6815",
             "ray.ports.autoscaler_metrics=6816", "ray.ports.min_worker=21002", "ray.ports.max_worker=21999",
             "ray.object_store_memory=209715200", f"security.token_file={tmp_path}/token2"]
    cfg = str(root / "cluster_configs/local.yaml")
    temp_dir = load_cluster(cfg, over).temp_dir
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    def ray_pids(folder: str) -> list[str]:  # this temp dir's, not a longer name's (vctest2 beside vctest)
        return subprocess.run(["pgrep", "-f", f"temp.dir={folder}( |/|$)"], capture_output=True,
                              text=True).stdout.split()

    try:
        rc, rep = cli_json(capsys, "up", cfg, *over)
        assert rc == 0, rep
        monkeypatch.chdir(tmp_path)
        gone.rmdir()
        pids = ray_pids(temp_dir)
        cwds = {p: os.readlink(f"/proc/{p}/cwd") for p in pids if os.path.exists(f"/proc/{p}")}
        assert pids and set(cwds.values()) == {temp_dir}, cwds
        assert oct(os.stat(os.path.dirname(temp_dir)).st_mode & 0o777) == "0o700"
        rc, st = cli_json(capsys, "status", cfg, *over)
        assert rc == 0 and st["healthy"] and st["nodes"][0]["host"] == "localhost"
        rc, rep = cli_json(capsys, "up", cfg, *over)
        assert rc == 0 and rep["nodes"][0]["action"] == "kept"
        # watch's hang bundle and clean slate through the product's code, on an actor in a pooled worker (no
        # RAY_JOB_ID of its job): SIGSTOPped, named with its own frames and log, then gone
        r = subprocess.run([sys.executable, str(root / "scripts/gpu/gpu_bundle_check.py"), "--cpu", "--cluster", cfg,
                            *over], capture_output=True, text=True, timeout=300, cwd=root)
        doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
        assert r.returncode == 0 and doc["problems"] == [], (doc.get("problems"), r.stdout[-3000:], r.stderr[-3000:])
        assert doc["stuck"].startswith(f"127.0.0.1 pid {doc['actor_pid']} (worker, stopped) ray::Holder")
        assert doc["frames"][0].startswith("Thread ") and "Holder.hold_here" in doc["frames"][1], doc["frames"]
        # a second cluster of ours on this machine (the grid runs one per GPU set): its own name, ports and temp
        # dir; up beside the first, and the first's down leaves it running
        rc, rep = cli_json(capsys, "up", cfg, *other)
        assert rc == 0, rep
        rc, st = cli_json(capsys, "status", cfg, *other)  # each names the other (verl jobs would share /tmp)
        assert rc == 0 and "vctest" in st["nodes"][0]["other_clusters"], st["nodes"][0]
        rc, shown, _ = cli(capsys, "status", cfg, *other)
        assert rc == 0 and "localhost also runs Ray of cluster(s)" in shown and "vctest" in shown, shown[-1500:]
    finally:
        try:
            rc, rep = cli_json(capsys, "down", cfg, *over)
            assert rc == 0 and rep["nodes"][0]["stopped"] > 0
            assert ray_pids(temp_dir) == []
            rc, st = cli_json(capsys, "status", cfg, *other)
            assert rc == 0 and st["healthy"] and "vctest" not in st["nodes"][0]["other_clusters"], st
        finally:
            rc2, rep2 = cli_json(capsys, "down", cfg, *other)
    assert rc2 == 0 and rep2["nodes"][0]["stopped"] > 0
    assert ray_pids(load_cluster(cfg, other).temp_dir) == []
