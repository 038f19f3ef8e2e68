"""Errors name the real cause (issue 32 item 3): a missing SSH key file, SSH settings on a host that runs without
SSH, the Python beside a wrong `ray`, the setting `up` found changed."""

import json
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import ConfigError, ConnectError
from verl_cluster.lifecycle.commands import plan_start
from verl_cluster.lifecycle.up import _state_json, changed_settings
from verl_cluster.runners import LocalRunner, SshRunner, SshTarget
from verl_cluster.runners.remote_python import PythonNotFound, run_python

LOCAL = str(Path(__file__).resolve().parents[2] / "cluster_configs/local.yaml")


def test_missing_key_file_is_named_not_unreachable(tmp_path):
    missing = tmp_path / "id_nope"
    with pytest.raises(ConnectError) as e:  # before any connection: the port below is never dialled
        SshRunner(SshTarget("127.0.0.1", port=1, key_file=str(missing), connect_timeout_s=1)).connect()
    assert f"SSH key file {missing}" in e.value.reason and "does not exist" in e.value.reason
    assert "ssh.key_file" in e.value.hint and "sshd" not in e.value.hint
    (tmp_path / "adir").mkdir()
    with pytest.raises(ConnectError, match="is not a file"):
        SshRunner(SshTarget("127.0.0.1", port=1, key_file=str(tmp_path / "adir"), connect_timeout_s=1)).connect()


def test_status_and_check_name_the_key_file(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster_name: k\nhead: {{host: 127.0.0.2}}\nssh: {{port: 1, key_file: {tmp_path}/id_gone, "
                   "connect_timeout_s: 2}\n")
    assert main(["status", "-c", str(cfg), "--json"]) == 1
    reason = json.loads(capsys.readouterr().out)["nodes"][0]["reason"]
    assert f"SSH key file {tmp_path}/id_gone" in reason and "cannot reach" not in reason


def test_status_says_the_key_file_problem_not_unreachable(tmp_path, capsys):
    """A key file that is missing (or not a file) is a setting to fix: status names the node, the file and the fix
    as check does, and never calls the node unreachable (it was never dialled)."""
    (tmp_path / "adir").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster_name: k\nhead: {{host: 127.0.0.2}}\nworkers:\n  - {{host: 127.0.0.3, ssh_key_file: "
                   f"{tmp_path}/adir}}\nssh: {{port: 1, key_file: {tmp_path}/id_gone, connect_timeout_s: 2}}\n")
    assert main(["status", "-c", str(cfg), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [n["state"] for n in doc["nodes"]] == ["ssh-key", "ssh-key"]
    head, worker = (next(p for p in doc["problems"] if p.startswith(h)) for h in ("127.0.0.2: ", "127.0.0.3: "))
    assert f"SSH key file {tmp_path}/id_gone" in head and "does not exist" in head
    assert f"SSH key file {tmp_path}/adir" in worker and "is not a file" in worker
    assert all("; fix: point ssh.key_file (or the node's ssh_key_file) at the private key" in p for p in (head, worker))
    assert main(["status", "-c", str(cfg)]) == 1
    text = capsys.readouterr().out
    assert "unreachable" not in text and "ssh-key" in text and f"problem: 127.0.0.3: SSH key file {tmp_path}/adir" in text


def test_a_missing_identityfile_of_ssh_config_is_passed_over(tmp_path, monkeypatch):
    from verl_cluster.runners.ssh import _resolve

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/config").write_text("Host box\n  IdentityFile ~/.ssh/gone\n  IdentityFile ~/.ssh/there\n")
    (tmp_path / ".ssh/there").write_text("key")
    assert _resolve(SshTarget("box"))[3] == [str(tmp_path / ".ssh/there")]


@pytest.mark.parametrize("over, names", [
    (["ssh.port=2222"], ["ssh.port", "head.host `localhost`"]),
    (["head.host=127.0.0.1", "ssh.user=me", "ssh.key_file=/k"], ["ssh.user, ssh.key_file", "127.0.0.1"]),
    (["head.host=127.0.0.1", "head.ssh_port=2222"], ["head.host `127.0.0.1`", "ssh_port"]),
])
def test_ssh_settings_on_a_local_host_are_refused(over, names):
    with pytest.raises(ConfigError) as e:
        load_cluster(LOCAL, over)
    for n in names:
        assert n in e.value.message
    assert "real address" in e.value.hint and "leave the SSH settings out" in e.value.hint


def test_ssh_settings_for_workers_beside_a_local_head_stay_allowed():
    load_cluster(LOCAL, ["head.node_ip=10.0.0.1", "workers=[{host: 10.0.0.2}]", "ssh.port=2222", "ssh.user=me"])


def test_python_beside_a_wrong_ray_is_named():
    with pytest.raises(PythonNotFound) as e:
        run_python(LocalRunner(), "/opt/nowhere/bin/python", "print(1)")
    assert "`/opt/nowhere/bin/python` not found" in e.value.reason and "ray.ray_executable" in e.value.reason
    assert "ray.ray_executable" in e.value.hint


def test_over_ssh_rc_127_is_the_missing_python_too():
    class Shell127:  # what a remote shell answers for a command that is not there
        host = "n1"

        def run(self, argv, env=None, timeout=60):
            from verl_cluster.runners.base import Result
            return Result(127, "", f"timeout: failed to run command '{argv[0]}': No such file or directory\n")

    with pytest.raises(PythonNotFound, match="ray.ray_executable"):
        run_python(Shell127(), "/opt/nowhere/bin/python", "print(1)")


def test_check_says_not_probed_not_unreachable(capsys):
    assert main(["check", "-c", LOCAL, "ray.ray_executable=/opt/nowhere/bin/ray", "--quick", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    what = " ".join(p["what"] for p in doc["problems"])
    assert "/opt/nowhere/bin/python" in what and "unreachable" not in what
    assert doc["not_probed"]


def _cmd(over):
    spec = load_cluster(LOCAL, over)
    return plan_start(spec)[0]


def test_up_names_the_changed_setting():
    running = json.loads(_state_json(_cmd(["ray.object_store_memory=209715200"])))
    assert changed_settings(running, _cmd(["ray.object_store_memory=209715201"])) == [
        "ray.object_store_memory 209715200 -> 209715201"]
    assert changed_settings(running, _cmd(["ray.object_store_memory=209715200", "head.dashboard_port=8300"])) == [
        "head.dashboard_port 8265 -> 8300"]
    assert changed_settings(running, _cmd(["ray.object_store_memory=null"])) == ["ray.object_store_memory unset"]
    env = changed_settings(running, _cmd(["ray.object_store_memory=209715200", "ray.env={FOO: secret}"]))
    assert env == ["env FOO added (ray.env, the node's env or the network settings)"]
    assert "secret" not in _state_json(_cmd(["ray.env={FOO: secret}"]))  # values are never kept, only hashes


def test_up_reason_carries_it():
    from verl_cluster.lifecycle.up import NodeAction, _Up

    job = _Up.__new__(_Up)
    cmd = _cmd(["ray.object_store_memory=209715201"])
    from verl_cluster.lifecycle.up import NodeOutcome

    job.out = {cmd.host: NodeOutcome(cmd.host, "head", cmd.ip)}
    job.probes = {cmd.host: type("P", (), {"state": json.loads(_state_json(_cmd(["ray.object_store_memory=null"])))})()}
    job.cmds = {cmd.host: cmd}
    job.say = lambda host, msg: None
    job._mark_changed(type("N", (), {"host": cmd.host})())
    o = job.out[cmd.host]
    assert o.action == NodeAction.CHANGED and "ray.object_store_memory set (209715201)" in o.reason
    assert "up --restart" in o.reason



@pytest.mark.parametrize("command", ["logs", "stop"])
def test_an_id_one_character_short_gets_did_you_mean(command, capsys):
    from verl_cluster.records import job_records

    sid = "raysubmit_Ab12Cd34Ef56Gh78"
    job_records.record(sid, LOCAL, "local", "gsm8k")  # this test's own HOME (tests/conftest.py)
    assert main([command, sid[:-1]]) == 2
    err = capsys.readouterr().err
    assert f"no job `{sid[:-1]}` was submitted from here" in err and f"did you mean `{sid}`?" in err


def test_nccl_exact_match_prefix_is_explained(tmp_path):
    from dataclasses import replace

    from verl_cluster.diagnostics.backend import select_backend
    from verl_cluster.facts.model import NodeFacts, from_json

    facts_dir = Path(__file__).resolve().parents[1] / "fixtures/facts"
    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: t\nhead: {host: 10.0.0.1}\nworkers: [{host: 10.0.0.5}]\n")
    f = {h: replace(from_json(NodeFacts, (facts_dir / "rdma_ucx.json").read_text()), host=h)
         for h in ("10.0.0.1", "10.0.0.5")}
    choice = select_backend(load_cluster(c), f)
    iface = choice.env["10.0.0.5"]["NCCL_SOCKET_IFNAME"][1:]
    said = [r for r in choice.reasons if r.startswith(f"NCCL_SOCKET_IFNAME=={iface}")]
    assert said and "NCCL's exact match" in said[0] and f"starts with `{iface}`" in said[0]
