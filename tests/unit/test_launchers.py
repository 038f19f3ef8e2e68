"""The launcher is chosen once from the config and answers for its kind of cluster: the runner, how `ray start`
runs and is held, what `up --dry-run` shows, which nodes are unsafe; nothing else asks which launcher it is."""

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from verl_cluster import launchers
from verl_cluster.config.cluster import ClusterSpec, HeadSpec, NodeSpec, SlurmSpec
from verl_cluster.config.job import job_from_data
from verl_cluster.errors import ConfigError
from verl_cluster.launchers import runner_for
from verl_cluster.launchers.slurm import SlurmLauncher
from verl_cluster.launchers.ssh import LocalLauncher, SshLauncher
from verl_cluster.lifecycle.bring_up import BringUp, plan
from verl_cluster.lifecycle.up import NodeAction, NodeOutcome, UpReport
from verl_cluster.runners.local import LocalRunner
from verl_cluster.runners.ssh import SshRunner
from verl_cluster.slurm import allocation as al
from verl_cluster.slurm.runner import SlurmRunner
from verl_cluster.slurm.spec import fill

PACKAGE = Path(__file__).resolve().parents[2] / "verl_cluster"


def slurm_spec() -> ClusterSpec:
    return ClusterSpec(cluster_name="slurm-7", head=HeadSpec(host="gpu01", node_ip="10.0.0.1", cpus=64),
                       workers=[NodeSpec(host="gpu02", node_ip="10.0.0.2", cpus=64)], launcher="slurm",
                       slurm=SlurmSpec(job_id="7", srun_args=["--mpi=none"]))


def test_the_config_chooses_the_launcher_and_it_gives_the_runners():
    local = ClusterSpec(cluster_name="l", head=HeadSpec(host="localhost"))
    assert type(launchers.launcher_for(local)) is LocalLauncher
    assert isinstance(runner_for(local, local.head), LocalRunner)

    mixed = ClusterSpec(cluster_name="m", head=HeadSpec(host="localhost", node_ip="10.0.0.1"),
                        workers=[NodeSpec(host="10.0.0.2", ssh_port=2222)])
    ssh = launchers.launcher_for(mixed)
    assert type(ssh) is SshLauncher
    assert isinstance(ssh.runner(mixed.head), LocalRunner)  # a localhost node runs here, even over SSH
    remote = ssh.runner(mixed.workers[0])
    assert isinstance(remote, SshRunner) and remote.target.port == 2222

    spec = slurm_spec()
    slurm = launchers.launcher_for(spec)
    assert type(slurm) is SlurmLauncher
    r = runner_for(spec, spec.workers[0])
    assert isinstance(r, SlurmRunner) and (r.host, r.job_id, r.cpus, r.extra_args) == ("gpu02", "7", 64, ["--mpi=none"])


def test_slurm_holds_ray_in_a_step_and_dry_run_shows_it():
    planned = plan(slurm_spec())
    assert [p.command.host for p in planned] == ["gpu01", "gpu02"]
    assert all(p.command.argv[-1] == "--block" for p in planned)
    via = planned[1].via
    assert via[0] == "srun" and "--nodelist=gpu02" in via and "--job-name=vc-ray" in via
    assert "--cpus-per-task=64" in via and via[-1] == "--mpi=none" and "--" not in via

    ssh = ClusterSpec(cluster_name="s", head=HeadSpec(host="10.0.0.1"), workers=[NodeSpec(host="10.0.0.2")])
    planned = plan(ssh)
    assert all("--block" not in p.command.argv and p.via == [] for p in planned)


class _Runner:
    """Records how `ray start` was asked to run."""

    def __init__(self):
        self.calls = []

    def run(self, argv, *, env=None, timeout=60.0, stdin=None):
        self.calls.append(("run", list(argv), timeout))
        return "ran"

    def run_held(self, argv, *, env=None, timeout=90.0):
        self.calls.append(("run_held", list(argv), timeout))
        return "held"


def test_ray_starts_as_a_daemon_or_held():
    ssh = launchers.launcher_for(ClusterSpec(cluster_name="s", head=HeadSpec(host="10.0.0.1")))
    r = _Runner()
    assert ssh.start_ray(r, ("ray", "start"), env={}, timeout=5) == "ran"
    assert launchers.launcher_for(slurm_spec()).start_ray(r, ("ray", "start", "--block"), env={}, timeout=7) == "held"
    assert r.calls == [("run", ["ray", "start"], 5), ("run_held", ["ray", "start", "--block"], 7)]


def test_running_means_raylet_and_on_the_head_the_gcs():
    for launcher in (launchers.launcher_for(slurm_spec()),
                     launchers.launcher_for(ClusterSpec(cluster_name="s", head=HeadSpec(host="10.0.0.1")))):
        assert launcher.running("head", raylet=True, gcs=True) and launcher.running("worker", raylet=True, gcs=False)
        assert not launcher.running("head", raylet=True, gcs=False)
        assert not launcher.running("worker", raylet=False, gcs=False)


def test_slurm_names_drained_nodes_and_says_when_it_cannot_ask():
    shown = ("NodeName=gpu01 NodeAddr=10.0.0.1 State=ALLOCATED\n"
             "NodeName=gpu02 NodeAddr=10.0.0.2 State=MIXED+DRAIN Reason=xid 79 on GPU 3 [root@2026-11-25T01:02:03]\n")
    asked = []

    def run(argv):
        asked.append(list(argv))
        return shown

    launcher = launchers.launcher_for(slurm_spec())
    [(node, what, fix)] = launcher.node_problems(run)
    assert asked == [["scontrol", "show", "node", "-o", "gpu01,gpu02"]]
    assert node == "gpu02" and "MIXED+DRAIN" in what and "xid 79 on GPU 3" in what and "--exclude=gpu02" in fix

    def down(argv):
        raise ConfigError("`scontrol show node` failed: slurmctld down", "try `scontrol ping`")
    assert launcher.node_problems(down) == [("slurm", "node states unavailable: `scontrol show node` failed: "
                                                      "slurmctld down", "try `scontrol ping`")]
    assert launchers.launcher_for(ClusterSpec(cluster_name="s", head=HeadSpec(host="h"))).node_problems() == []


def test_load_cluster_lets_the_launcher_fill_its_nodes(tmp_path, monkeypatch):
    alloc = al.Allocation("7", [al.SlurmNode("gpu01", "10.0.0.1", cpus=8, gpus=2),
                                al.SlurmNode("gpu02", "10.0.0.2", cpus=8, gpus=2)], True)
    monkeypatch.setattr("verl_cluster.launchers.slurm.fill",
                        lambda data, source: fill(data, source, read=lambda job_id=None: alloc))
    p = tmp_path / "c.yaml"
    p.write_text("head: {gcs_port: 6390}\n")
    spec = launchers.load_cluster(p, ["launcher=slurm"])
    assert (spec.cluster_name, spec.launcher, spec.slurm.job_id) == ("slurm-7", "slurm", "7")
    assert [(n.host, n.node_ip, n.gpus) for _, n in spec.nodes()] == [("gpu01", "10.0.0.1", 2),
                                                                       ("gpu02", "10.0.0.2", 2)]
    assert spec.head.gcs_port == 6390
    p.write_text("cluster_name: plain\nhead: {host: 10.0.0.9}\n")
    assert launchers.load_cluster(p).head.host == "10.0.0.9"  # an SSH cluster's config is left as written
    # `submit` inside an allocation holds the job against it; a file that lists its nodes has none
    monkeypatch.setattr(al, "read_allocation", lambda job_id=None: alloc if job_id == "7" else None)
    assert SlurmLauncher.allocation({"launcher": "slurm", "slurm": {"job_id": "7"}}) is alloc
    assert launchers.launcher_class({"launcher": "ssh"}).allocation({}) is None
    job = job_from_data({"name": "j", "entrypoint": "verl.trainer.main_ppo",
                         "overrides": {"trainer": {"nnodes": 4, "n_gpus_per_node": 2}}}, "j.yaml")
    launchers.check_job_fits(job, str(p))  # an SSH cluster file: nothing to hold it against
    p.write_text('launcher: slurm\nslurm: {job_id: "7"}\n')
    with pytest.raises(ConfigError, match=r"Slurm allocation 7 has 2 node\(s\), but job j needs 4") as e:
        launchers.check_job_fits(job, str(p))
    assert "--nodes=4" in e.value.hint


def test_node_outcome_json_is_the_same_with_the_enum():
    o = NodeOutcome("h", "worker", "10.0.0.2", NodeAction.STARTED, gpus=2.0)
    d = o.to_json()
    assert list(d) == ["host", "role", "ip", "action", "reason", "log_tail", "seconds", "gpus", "cpus", "ok"]
    assert type(d["action"]) is str and d["action"] == "started" and d["ok"]
    assert json.loads(json.dumps(d))["action"] == "started" and f"{o.action}" == "started"
    assert not NodeOutcome("h", "worker", "ip", NodeAction.CHANGED).ok
    assert [a.value for a in NodeAction] == ["pending", "kept-pending", "kept", "started", "restarted", "changed",
                                             "failed", "unreachable"]


def test_the_quick_check_after_up_runs_only_when_a_node_was_started():
    spec = ClusterSpec(cluster_name="s", head=HeadSpec(host="10.0.0.1"))

    def done(*actions):
        return BringUp(spec, UpReport("s", [NodeOutcome(f"h{i}", "worker", "ip", a) for i, a in enumerate(actions)]))
    assert not done(NodeAction.KEPT, NodeAction.KEPT).needs_check  # only verified: it was checked before
    assert done(NodeAction.KEPT, NodeAction.RESTARTED).needs_check
    assert not done(NodeAction.STARTED, NodeAction.FAILED).needs_check  # unhealthy: `up` failed already
    kept = done(NodeAction.KEPT)
    assert kept.quick_check() is None and kept.healthy


def test_no_module_outside_the_launchers_asks_which_launcher_it_is():
    asks = re.compile(r"""[!=]=\s*["'](slurm|ssh|local)["']|["'](slurm|ssh|local)["']\s*[!=]=""")
    found = [f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}"
             for p in sorted(PACKAGE.rglob("*.py")) if "launchers" not in p.relative_to(PACKAGE).parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if asks.search(line)]
    assert not found, "ask the cluster's launcher (verl_cluster.launchers.launcher_for) instead:\n" + "\n".join(found)
    assert not re.search(r"getattr\(\w+, \"launcher\"", "\n".join(p.read_text() for p in PACKAGE.rglob("*.py")))


@pytest.mark.parametrize("name", next(f for f in fields(ClusterSpec) if f.name == "launcher").metadata["choices"])
def test_every_launcher_the_schema_allows_has_a_class(name):
    assert launchers.launcher_class({"launcher": name}).name == name


def test_up_dry_run_shows_how_the_launcher_reaches_each_node(tmp_path, monkeypatch, capsys):
    from verl_cluster.cli import main

    alloc = al.Allocation("7", [al.SlurmNode("gpu01", "10.0.0.1", cpus=8, gpus=0),
                                al.SlurmNode("gpu02", "10.0.0.2", cpus=8, gpus=0)], False)
    monkeypatch.setattr("verl_cluster.launchers.slurm.fill",
                        lambda data, source: fill(data, source, read=lambda job_id=None: alloc))
    monkeypatch.setenv("HOME", str(tmp_path))
    p = tmp_path / "c.yaml"
    p.write_text("launcher: slurm\n")
    assert main(["up", "-c", str(p), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.count("  via:  srun --jobid=7 --overlap") == 2 and "--nodelist=gpu02" in text
    assert main(["up", "-c", str(p), "--dry-run", "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert [n["argv"][-1] for n in nodes] == ["--block", "--block"] and "via" not in nodes[0]
    p.write_text("cluster_name: s\nhead: {host: 10.0.0.1}\n")
    assert main(["up", "-c", str(p), "--dry-run"]) == 0
    assert "via:" not in capsys.readouterr().out  # SSH: `ray start` runs as it is
