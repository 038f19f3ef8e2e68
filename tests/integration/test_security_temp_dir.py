"""Ray's temp dir on namespace hosts: another local user's folder (or one they can enter) is refused by `up` on the
node it is on, the per-user parent is made 0700, `check` names a loosened one per node, and a cluster still running
under the earlier shared default (/tmp/vc-<cluster>) is found by status, stopped by down and moved by up --restart."""

import os

import pytest

from tests.harness.cli import cli, cli_json
from verl_cluster.config.cluster import load_cluster
from verl_cluster.nodes.auth import ensure_token, node_token_path, remote_token_path
from verl_cluster.lifecycle.commands import plan_start
from verl_cluster.nodes.agent import Node

pytestmark = pytest.mark.integration




def mode_owner(host, path):
    return host.run(["stat", "-c", "%a %U", path]).stdout.strip()


def test_unsafe_temp_dir_is_refused_parent_made_private_and_checked(lab, capsys):
    head, w1 = lab.add_host("head"), lab.add_host("w1")
    cfg = str(lab.cluster_yaml(head, [w1], name="tdir"))
    spec = load_cluster(cfg)
    temp, parent = spec.temp_dir, os.path.dirname(spec.temp_dir)
    assert parent == f"/tmp/vc-{os.getuid()}"

    def refused(*setup: str) -> str:
        w1.run(["rm", "-rf", parent], check=True)
        w1.run(["sh", "-c", " && ".join(setup)], check=True)
        rc, out, err = cli(capsys, "up", cfg)
        assert rc == 2 and f"{w1.ip}: ray.temp_dir {temp}" in err, (rc, out, err)
        for h in (head, w1):  # refused before anything started, on any node
            assert h.pids(f"temp.dir={temp}") == []
        return err

    # the per-user parent made by someone else first, open to all (0777)
    err = refused(f"mkdir -m 777 {parent}")
    assert f"{parent} (owner root, mode 0777)" in err and f"chmod 700 {parent}" in err
    # ... owned by another user (nobody), even if closed
    err = refused(f"mkdir -m 700 {parent}", f"chown nobody {parent}")
    assert f"{parent} (owner nobody, mode 0700) is not yours" in err
    # the temp dir itself made by another user inside a private parent
    err = refused(f"mkdir -m 700 {parent}", f"mkdir -m 700 {temp}", f"chown nobody {temp}")
    assert f"{temp} (owner nobody" in err and "is not yours" in err
    w1.run(["rm", "-rf", parent], check=True)

    rc, rep = cli_json(capsys, "up", cfg)
    assert rc == 0, rep["check"]["problems"]
    try:
        for h in (head, w1):
            assert mode_owner(h, parent) == "700 root"  # made by up; Ray opens the temp dir in it to all
            assert mode_owner(h, temp) == "777 root"
        rc, rep = cli_json(capsys, "check", cfg, "--quick")
        assert not [p for p in rep["problems"] if "temp dir" in p["what"]], rep["problems"]

        # loosened on one node of the live cluster: check names that node, up refuses to heal through it
        w1.run(["chmod", "755", parent], check=True)
        rc, rep = cli_json(capsys, "check", cfg, "--quick")
        found = [p for p in rep["problems"] if "ray.temp_dir" in p["what"]]
        assert rc == 1 and [(p["node"], p["severity"]) for p in found] == [(w1.ip, "error")], rep["problems"]
        assert f"{parent} (owner root, mode 0755) lets others in" in found[0]["what"]
        rc, st = cli_json(capsys, "status", cfg)
        assert any(p.startswith(f"{w1.ip}: ray.temp_dir:") for p in st["problems"]), st["problems"]
        rc, out, err = cli(capsys, "up", cfg)
        assert rc == 2 and "mode 0755" in err
        w1.run(["chmod", "700", parent], check=True)
        rc, rep = cli_json(capsys, "up", cfg)
        assert rc == 0 and {n["action"] for n in rep["nodes"]} == {"kept"}, rep
    finally:
        rc, rep = cli_json(capsys, "down", cfg)
    assert rc == 0 and rep["ok"]


def start_as_before(spec, host_ip: str) -> None:
    """Start the cluster's one node the way `up` did before the per-user default: the same command, but with the
    temp dir in the shared /tmp."""
    node = Node(spec, "head", spec.head)
    try:
        node.runner.put_file(str(ensure_token(spec)), remote_token_path(spec), 0o600)
        home = node.probe().home
        cmd = plan_start(spec, token_paths={host_ip: node_token_path(spec, home)})[0]
        argv = list(cmd.argv)
        argv[argv.index("--temp-dir") + 1] = spec.legacy_temp_dir
        res = node.runner.run(argv, env=cmd.env, timeout=120)
        assert res.ok, res.tail(20)
    finally:
        node.close()


def test_cluster_under_the_old_temp_dir_is_found_stopped_and_moved(lab, capsys):
    host = lab.add_host("old")
    cfg = str(lab.cluster_yaml(host, [], name="oldtd"))
    spec = load_cluster(cfg)
    old = spec.legacy_temp_dir
    assert old == "/tmp/vc-oldtd"
    start_as_before(spec, host.ip)
    try:
        assert host.pids(f"raylet.*temp.dir={old}")
        rc, st = cli_json(capsys, "status", cfg)
        assert rc == 0 and st["healthy"], [n["reason"] for n in st["nodes"]]
        assert any("earlier default temp dir /tmp/vc-oldtd" in p and "--restart" in p for p in st["problems"])
        rc, out, err = cli(capsys, "up", cfg)
        assert rc == 1 and "runs under the earlier default temp dir /tmp/vc-oldtd" in err and "--restart" in err
        assert host.pids(f"temp.dir={old}") and host.pids(f"temp.dir={spec.temp_dir}") == []  # left as it was

        rc, rep = cli_json(capsys, "down", cfg)
        assert rc == 0 and rep["nodes"][0]["stopped"] > 0 and host.pids(f"temp.dir={old}") == []

        start_as_before(spec, host.ip)
        rc, rep = cli_json(capsys, "up", cfg, "--restart")
        assert rc == 0 and rep["nodes"][0]["action"] == "restarted", rep
        assert host.pids(f"temp.dir={old}") == [] and host.pids(f"raylet.*temp.dir={spec.temp_dir}")
        rc, st = cli_json(capsys, "status", cfg)
        assert rc == 0 and not [p for p in st["problems"] if "temp dir" in p], st["problems"]
    finally:
        rc, rep = cli_json(capsys, "down", cfg)
    assert rc == 0 and host.pids(f"temp.dir={old}") == [] and host.pids(f"temp.dir={spec.temp_dir}") == []
