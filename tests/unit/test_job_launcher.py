"""The job launcher is chosen once (jobs/launcher.py): each kind builds its request from the same inputs and says
what it is by its flags, so the pipeline and the CLI never compare launcher names."""

from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import load_job
from verl_cluster.errors import ConfigError
from verl_cluster.jobs.launcher import JOB_LAUNCHERS, LaunchInputs, job_launcher_for
from verl_cluster.jobs.request import RayJobRequest, TorchrunRequest

ROOT = Path(__file__).resolve().parents[2]


def test_each_kind_builds_its_request_from_the_same_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = load_cluster(ROOT / "cluster_configs" / "local.yaml")
    job = load_job(ROOT / "launch" / "smoke.yaml", [])
    inputs = LaunchInputs({"trainer.total_epochs": 1}, {spec.head.host: {"NCCL_SOCKET_IFNAME": "eth0"}},
                          {"NCCL_SOCKET_IFNAME": "eth0"}, {}, "", 2)
    ray = job_launcher_for("ray").request(job, spec, inputs)
    torch = job_launcher_for("torchrun").request(job, spec, inputs)
    assert isinstance(ray, RayJobRequest) and ray.runtime_env["env_vars"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert isinstance(torch, TorchrunRequest) and torch.nproc_per_node == 2
    assert torch.nodes[0].env["NCCL_SOCKET_IFNAME"] == "eth0"  # the per-node env, not the merged one


def test_what_each_kind_is_is_said_by_flags():
    ray, torch = job_launcher_for("ray"), job_launcher_for("torchrun")
    assert (ray.on_cluster_ray, ray.detached) == (True, True)
    assert (torch.on_cluster_ray, torch.detached) == (False, False)
    ray.check_watchable()
    with pytest.raises(ConfigError, match="--watch needs a Ray job \\(torchrun runs are not watched yet\\)") as e:
        torch.check_watchable()
    assert "launcher: ray" in e.value.hint
    assert sorted(JOB_LAUNCHERS) == ["ray", "torchrun"]
    with pytest.raises(ConfigError, match="unknown kind 'slurm'"):
        job_launcher_for("slurm")
