"""Slurm facts without a Slurm: host lists, count lists, GPU variables, scontrol records, the spec fill,
the srun argv, the job-vs-allocation fit and the generated batch script."""

import shlex
import subprocess

import pytest

from verl_cluster.config.job import job_from_data
from verl_cluster.errors import ConfigError
from verl_cluster.slurm import allocation as al
from verl_cluster.slurm.batch import BatchRequest, script
from verl_cluster.config.job_shape import JobShape
from verl_cluster.slurm.fit import check_fits
from verl_cluster.slurm.runner import SlurmRunner
from verl_cluster.slurm.spec import fill

SHOW_NODES = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=32 CPUAlloc=64 NodeAddr=10.0.0.1 NodeHostName=gpu01 "
    "State=ALLOCATED ThreadsPerCore=1\n"
    "NodeName=gpu02 Arch=x86_64 NodeAddr=10.0.0.2 NodeHostName=gpu02 State=MIXED+DRAIN "
    "Reason=xid 79 on GPU 3 [root@2026-11-25T01:02:03]\n")


@pytest.mark.parametrize("text,want", [
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("gpu[01-02,07],login1", ["gpu01", "gpu02", "gpu07", "login1"]),
    ("n[8-10]-ib", ["n8-ib", "n9-ib", "n10-ib"]),
    ("node1", ["node1"]),
])
def test_expand_nodelist(text, want):
    assert al.expand_nodelist(text) == want


def test_expand_counts():
    assert al.expand_counts("8(x2),4") == [8, 8, 4]
    assert al.expand_counts("2") == [2]
    with pytest.raises(ConfigError):
        al.expand_counts("two")


@pytest.mark.parametrize("env,want", [
    ({"SLURM_GPUS_ON_NODE": "8"}, (True, 8)),
    ({"SLURM_GPUS_PER_NODE": "h100:4"}, (True, 4)),
    ({"SLURM_JOB_GPUS": "0,1,2"}, (True, 3)),
    ({"SLURM_GPUS": "16"}, (True, None)),
    ({}, (False, None)),
])
def test_gpus_per_node(env, want):
    assert al.gpus_per_node(env) == want


def test_parse_gres_and_records():
    assert al.parse_gres("gres/gpu:4") == (True, 4)
    assert al.parse_gres("gres:gpu:h100:8") == (True, 8)
    assert al.parse_gres("") == (False, None)
    recs = al.parse_records(SHOW_NODES)
    assert recs[1]["Reason"] == "xid 79 on GPU 3 [root@2026-11-25T01:02:03]"
    assert al.SlurmNode("gpu02", "10.0.0.2", recs[1]["State"]).drained
    assert not al.SlurmNode("gpu01", "10.0.0.1", recs[0]["State"]).drained


def fake_run(calls):
    def run(argv):
        calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            assert argv[3] == "gpu[01-02]", argv
            return "gpu01\ngpu02\n"
        if argv[:3] == ["scontrol", "show", "node"]:
            return SHOW_NODES
        if argv[:3] == ["scontrol", "show", "job"]:
            return "JobId=7 JobState=RUNNING NodeList=gpu[01-02] NumNodes=2 NumCPUs=128 TresPerNode=gres/gpu:8\n"
        raise AssertionError(argv)
    return run


def test_read_allocation_from_env_and_scontrol():
    calls = []
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_CPUS_PER_NODE": "64(x2)",
           "SLURM_GPUS_PER_NODE": "8"}
    a = al.read_allocation(env, run=fake_run(calls))
    assert [(n.name, n.addr, n.cpus, n.gpus) for n in a.nodes] == [("gpu01", "10.0.0.1", 64, 8),
                                                                   ("gpu02", "10.0.0.2", 64, 8)]
    assert a.gpus_requested and a.nodes[1].drained and "xid 79" in a.nodes[1].reason
    assert not any(c[:3] == ["scontrol", "show", "job"] for c in calls)  # the environment said it all
    # a job named by id from outside its shell: scontrol show job fills the rest
    b = al.read_allocation({}, job_id="7", run=fake_run([]))
    # another job's shell: its node list is not ours
    c = al.read_allocation({"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "other[1-9]"}, job_id="7", run=fake_run([]))
    assert [n.name for n in c.nodes] == ["gpu01", "gpu02"]
    assert [n.gpus for n in b.nodes] == [8, 8] and [n.cpus for n in b.nodes] == [64, 64]


def test_not_in_allocation_and_missing_tools():
    with pytest.raises(ConfigError, match="not inside a Slurm allocation") as e:
        al.job_id_from({})
    assert "salloc" in e.value.hint and "verl-cluster sbatch" in e.value.hint
    with pytest.raises(ConfigError, match="Slurm commands not found: srun, scontrol"):
        al.check_tools(which=lambda t: None)


def test_no_gpu_request_means_zero_gpus():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_CPUS_PER_NODE": "2(x2)"}
    run = fake_run([])

    def no_gres(argv):
        out = run(argv)
        return out.replace("TresPerNode=gres/gpu:8", "")
    a = al.read_allocation(env, run=no_gres)
    assert not a.gpus_requested and [n.gpus for n in a.nodes] == [0, 0]


def test_fill_head_first_and_refuses_hosts():
    alloc = al.Allocation("7", [al.SlurmNode("gpu01", "10.0.0.1", cpus=64, gpus=8),
                                al.SlurmNode("gpu02", "10.0.0.2", cpus=64, gpus=None)], True)
    data = fill({"launcher": "slurm", "head": {"gcs_port": 6380}}, "c.yaml", read=lambda job_id=None: alloc)
    assert data["cluster_name"] == "slurm-7" and data["slurm"]["job_id"] == "7"
    assert data["head"] == {"gcs_port": 6380, "host": "gpu01", "node_ip": "10.0.0.1", "gpus": 8, "cpus": 64}
    assert data["workers"] == [{"host": "gpu02", "node_ip": "10.0.0.2", "cpus": 64}]  # GPUs: NVML counts them
    assert data["security"]["dashboard_host"] == "private"
    with pytest.raises(ConfigError, match="`workers` come from the Slurm allocation"):
        fill({"launcher": "slurm", "workers": [{"host": "x"}]}, "c.yaml", read=lambda job_id=None: alloc)
    with pytest.raises(ConfigError, match="head.host comes from"):
        fill({"launcher": "slurm", "head": {"host": "x"}}, "c.yaml", read=lambda job_id=None: alloc)
    with pytest.raises(ConfigError, match="loopback"):
        fill({"launcher": "slurm", "security": {"dashboard_host": "loopback"}}, "c.yaml",
             read=lambda job_id=None: alloc)


def test_srun_argv_is_one_list_and_held_takes_the_node():
    r = SlurmRunner("gpu02", "7", cpus=64, extra_args=["--mpi=none"])
    argv = r.srun_argv(["python", "-c", "print('a b')"], timeout=30)
    assert argv[:8] == ["srun", "--jobid=7", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu02",
                        "--export=ALL", "--quiet"]
    assert argv[argv.index("--") - 1] == "--mpi=none"
    assert argv[argv.index("--") + 1:] == ["timeout", "-k", "5", "30", "python", "-c", "print('a b')"]
    held = r.srun_argv(["ray", "start", "--block"], held=True)
    assert "--cpus-per-task=64" in held and "--job-name=vc-ray" in held


def test_missing_srun_is_a_runner_error(tmp_path):
    from verl_cluster.errors import RunnerError

    r = SlurmRunner("gpu02", "7", srun=str(tmp_path / "no-srun"))
    with pytest.raises(RunnerError, match="not found"):
        r.run(["true"])


def _job(data):
    return job_from_data({"name": "j", "launcher": "ray", "command": ["python", "x.py"], **data}, "j.yaml")


def test_job_shape_and_fit():
    def job_shape(job):
        s = JobShape.of(job)
        return s.nodes, s.gpus_per_node, s.needs_gpus

    assert job_shape(_job({"overrides": {"trainer": {"nnodes": 2, "n_gpus_per_node": 8}}})) == (2, 8, True)
    assert job_shape(_job({"placement": {"gpus": "4x8xH100-80GB"}})) == (4, 8, True)
    assert job_shape(_job({})) == (None, None, False)
    ppo = job_from_data({"name": "p", "entrypoint": "verl.trainer.main_ppo"}, "p.yaml")
    assert job_shape(ppo)[2]  # verl's trainers run on GPUs even when the count is left to the planner
    j = _job({"overrides": {"trainer": {"nnodes": 4, "n_gpus_per_node": 8}}})
    with pytest.raises(ConfigError, match="has 2 node\\(s\\), but job j needs 4") as e:
        check_fits(j, 2, 8, True, "Slurm allocation 7")
    assert "--nodes=4" in e.value.hint
    with pytest.raises(ConfigError, match="has no GPUs") as e:
        check_fits(j, 4, 0, False, "Slurm allocation 7")
    assert "--gpus-per-node=8" in e.value.hint
    with pytest.raises(ConfigError, match="has 4 GPU\\(s\\) per node"):
        check_fits(j, 4, 4, True, "Slurm allocation 7")
    check_fits(j, 4, 8, True, "Slurm allocation 7")


def test_batch_script_steps_trap_and_quoting(tmp_path):
    req = BatchRequest(job_file="/data/my job.yaml", job_name="gsm8k ppo", nodes=2, gpus_per_node=8, time="4:00:00",
                       partition="gpu", account="lab-1", log_dir=str(tmp_path / "logs"),
                       overrides=["data.train_batch_size=256", "trainer.experiment_name=a b"],
                       cluster_overrides=["ray.object_store_memory=2e9"], python="/opt/venv/bin/python")
    text = script(req)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --time=4:00:00",
                 "#SBATCH --partition=gpu", "#SBATCH --account=lab-1", "#SBATCH --job-name=gsm8k-ppo",
                 f"#SBATCH --output={tmp_path}/logs/slurm-%j.out", "#SBATCH --signal=B:TERM@90"):
        assert want in lines
    assert "trap cleanup EXIT" in text
    order = [text.index(f"step {s} ") for s in ("up", "check", "submit")]
    assert order == sorted(order)
    submit = next(ln for ln in lines if ln.startswith("step submit "))
    assert shlex.split(submit)[2:] == ["/opt/venv/bin/python", "-m", "verl_cluster", "submit", "/data/my job.yaml",
                                       "--slurm", "--watch", "data.train_batch_size=256",
                                       "trainer.experiment_name=a b"]
    assert "ray.object_store_memory=2e9" in next(ln for ln in lines if ln.startswith("step up "))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0  # valid bash
    with pytest.raises(ConfigError, match="not a Slurm time"):
        script(BatchRequest(job_file="/j.yaml", job_name="j", nodes=1, time="4h"))


def _cli(*args, env):
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "verl_cluster", *map(str, args)], capture_output=True, text=True,
                          cwd=root, timeout=120, env={**os.environ, **env})


def test_cli_bad_input_one_line_each(tmp_path):
    no_slurm = {"PATH": str(tmp_path), "SLURM_JOB_ID": "7", "HOME": str(tmp_path)}
    r = _cli("up", "--slurm", env=no_slurm)
    assert r.returncode == 2 and "error: Slurm commands not found: srun, scontrol" in r.stderr
    assert "module load slurm" in r.stderr and "Traceback" not in r.stderr
    r = _cli("sbatch", "launch/smoke.yaml", "trainer.nnodes=3", "--nodes", "2", "--dry-run", env={})
    assert r.returncode == 2 and "has 2 node(s), but job smoke needs 3" in r.stderr
    r = _cli("sbatch", "launch/gsm8k.yaml", "--nodes", "1", "--dry-run", env={})
    assert r.returncode == 2 and "has no GPUs, but job gsm8k-ppo runs on GPUs" in r.stderr
    r = _cli("sbatch", "launch/smoke.yaml", "--time", "two hours", "--dry-run", env={})
    assert r.returncode == 2 and "is not a Slurm time" in r.stderr
    r = _cli("sbatch", "launch/smoke.yaml", "--submit", "-o", tmp_path / "s.sbatch", "--log-dir", tmp_path / "logs",
             env={"PATH": str(tmp_path)})
    assert r.returncode == 2 and "`sbatch` not found" in r.stderr and (tmp_path / "s.sbatch").is_file()
