"""Building the submit request: overrides, entrypoint, env (secrets masked), launcher choice, torchrun argv."""

import json
import shlex
from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import load_job
from verl_cluster.errors import ClusterError, ConfigError
from verl_cluster.submit.integrations import BackendEnv, config_interface_env
from verl_cluster.verl_scripts.hydra_values import to_hydra
from verl_cluster.jobs.request import (MASK, build_ray_request, build_torchrun_request, effective_overrides,
                                         secret_values, submission_id)
from verl_cluster.submit.pipeline import decide_launcher, needs_ray

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: c1\nhead: {host: 10.0.0.1, gpus: 2}\nworkers: [{host: 10.0.0.2}]\n"
                 "ray: {ray_executable: /opt/venv/bin/ray}\nnetwork: {interface: ens5}\n")
    return load_cluster(p)


def write_job(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def test_hydra_values():
    assert to_hydra(["/d/a.parquet", "/d/b.parquet"]) == "[/d/a.parquet,/d/b.parquet]"
    assert to_hydra(True) == "true" and to_hydra(None) == "null" and to_hydra(1e-6) == "1e-06"
    assert to_hydra("a b") == "'a b'" and to_hydra("it's") == "'it\\'s'"
    assert to_hydra("true") == "'true'"  # a string, not the boolean
    assert to_hydra(["console", "wandb"]) == "[console,wandb]"


def test_submission_id_is_name_plus_timestamp():
    sid = submission_id("gsm8k ppo!", now=1795251016.123)
    assert sid == "gsm8k-ppo-20261121-085016-123"


def test_ray_request_entrypoint_env_and_masking(tmp_path, cluster):
    job = load_job(write_job(tmp_path, """
name: ppo
entrypoint: verl.trainer.main_ppo
model: {path: /models/qwen}
data: {train_files: [/d/train.parquet]}
overrides: {data: {train_batch_size: 64}, trainer: {logger: [console]}}
env: {HF_HUB_OFFLINE: "1"}
secrets: [WANDB_API_KEY]
"""), ["data.train_batch_size=256", "trainer.n_gpus_per_node=2"])
    secrets = secret_values(job, {"WANDB_API_KEY": "s3cr3t-value"})
    plan_over = {"actor_rollout_ref.rollout.tensor_model_parallel_size": 2, "data.train_batch_size": 8}
    over = effective_overrides(job, plan_over)
    assert over["data.train_batch_size"] == 256  # the command line beats the file, the job beats the planner
    assert over["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    env = {"NCCL_SOCKET_IFNAME": "ens5"}
    req = build_ray_request(job, cluster, over, env, secrets, plan_meta='{"feasible": true}', now=0)
    argv = shlex.split(req.entrypoint)
    assert argv[:3] == ["/opt/venv/bin/python", "-m", "verl.trainer.main_ppo"]
    assert "data.train_files=[/d/train.parquet]" in argv and "trainer.logger=[console]" in argv
    assert "actor_rollout_ref.model.path=/models/qwen" in argv
    assert req.runtime_env["env_vars"] == {"NCCL_SOCKET_IFNAME": "ens5", "HF_HUB_OFFLINE": "1",
                                           "WANDB_API_KEY": "s3cr3t-value", "VERL_CLUSTER_GC": "freeze"}
    assert req.metadata["verl_cluster.plan"] == '{"feasible": true}'
    shown = json.dumps(req.describe())
    assert "s3cr3t-value" not in shown and f'"WANDB_API_KEY": "{MASK}"' in shown
    assert "s3cr3t-value" not in json.dumps(req.metadata)


def test_missing_secret_is_bad_input(tmp_path):
    job = load_job(write_job(tmp_path, "name: x\ncommand: [python, t.py]\nsecrets: [HF_TOKEN]\n"))
    with pytest.raises(ConfigError, match="secret HF_TOKEN not set in this shell"):
        secret_values(job, {})


def test_command_python_made_absolute_and_working_dir_resolved(tmp_path, cluster):
    (tmp_path / "code").mkdir()
    job = load_job(write_job(tmp_path, "name: s\ncommand: [python, run.py, --x]\nworking_dir: code\n"
                                       "runtime_env: {pip: [tqdm]}\n"))
    req = build_ray_request(job, cluster, {}, {}, {})
    assert req.argv == ["/opt/venv/bin/python", "run.py", "--x"]
    assert req.runtime_env["working_dir"] == str((tmp_path / "code").resolve())
    assert req.runtime_env["pip"] == ["tqdm"]
    bad = load_job(write_job(tmp_path, "name: s\ncommand: [python, run.py]\nworking_dir: nope\n"))
    with pytest.raises(ConfigError, match="working_dir `nope` is not a directory"):
        build_ray_request(bad, cluster, {}, {}, {})


def test_torchrun_request_per_node(tmp_path, cluster):
    job = load_job(write_job(tmp_path, "name: sft\nentrypoint: verl.trainer.sft_trainer\n"
                                       "torchrun: {master_port: 29600}\nsecrets: [TOK]\n"))
    benv = BackendEnv({"10.0.0.1": {"GLOO_SOCKET_IFNAME": "ens5"}, "10.0.0.2": {"GLOO_SOCKET_IFNAME": "ens6"}}, "t")
    req = build_torchrun_request(job, cluster, {"data.train_batch_size": 8}, benv.by_host, {"TOK": "xyz"}, gpus_per_node=2)
    assert [n.rank for n in req.nodes] == [0, 1]
    a0 = req.nodes[0].argv
    assert a0[:3] == ["/opt/venv/bin/python", "-m", "torch.distributed.run"]
    assert a0[a0.index("--nnodes") + 1] == "2" and a0[a0.index("--nproc-per-node") + 1] == "2"
    assert a0[a0.index("--master-addr") + 1] == "10.0.0.1" and a0[a0.index("--master-port") + 1] == "29600"
    assert req.nodes[1].argv[req.nodes[1].argv.index("--node-rank") + 1] == "1"
    assert a0[-3:] == ["-m", "verl.trainer.sft_trainer", "data.train_batch_size=8"]
    assert req.nodes[1].env["GLOO_SOCKET_IFNAME"] == "ens6"
    assert "xyz" not in json.dumps(req.describe())


def test_torchrun_plain_commands(tmp_path, cluster):
    job = load_job(write_job(tmp_path, "name: t\ncommand: [python3, train.py]\nargs: [--steps, '3']\n"))
    req = build_torchrun_request(job, cluster, {}, {}, {})
    assert req.nodes[0].argv[-3:] == ["train.py", "--steps", "3"] and req.nproc_per_node == 2
    job = load_job(write_job(tmp_path, "name: t\ncommand: [./run.sh]\n"))
    assert build_torchrun_request(job, cluster, {}, {}, {}).nodes[0].argv[-2:] == ["--no-python", "./run.sh"]


def test_torchrun_takes_pythons_own_flags_as_the_environment_of_its_ranks(tmp_path, cluster):
    """`python -u train.py` under torchrun: -u is python's, not torchrun's; the ranks get PYTHONUNBUFFERED instead
    (torchrun starts each with its own interpreter). A flag with no such form is an error naming the command."""
    job = load_job(write_job(tmp_path, "name: t\ncommand: [python, -u, -W, ignore, -B, train.py, --lr, '1']\n"))
    req = build_torchrun_request(job, cluster, {}, {}, {})
    argv = req.nodes[0].argv
    assert argv[argv.index("--rdzv-conf") + 2:] == ["train.py", "--lr", "1"] and "-u" not in argv
    assert {k: req.nodes[1].env[k] for k in ("PYTHONUNBUFFERED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE")} == \
        {"PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1"}
    job = load_job(write_job(tmp_path, "name: t\ncommand: [python3, -u, -m, pkg.train]\n"))
    assert build_torchrun_request(job, cluster, {}, {}, {}).nodes[0].argv[-2:] == ["-m", "pkg.train"]
    job = load_job(write_job(tmp_path, "name: t\ncommand: [python, -c, 'print(1)']\n"))
    with pytest.raises(ConfigError) as e:
        build_torchrun_request(job, cluster, {}, {}, {})
    assert "command: python -c cannot go through torchrun" in e.value.message and "launcher: ray" in e.value.hint


def test_launcher_choice(tmp_path):
    ppo = load_job(write_job(tmp_path, "name: p\nentrypoint: verl.trainer.main_ppo\n"))
    sft = load_job(write_job(tmp_path, "name: s\nentrypoint: verl.trainer.sft_trainer\n"))
    assert needs_ray(ppo) and not needs_ray(sft)
    assert decide_launcher(ppo, True, "c.yaml") == "ray"
    with pytest.raises(ClusterError) as e:
        decide_launcher(ppo, False, "c.yaml", "head 10.0.0.1: missing")
    assert "`verl.trainer.main_ppo` runs on Ray" in e.value.message and e.value.hint == "start it first: verl-cluster up c.yaml"
    assert decide_launcher(sft, True, "c.yaml") == "ray"
    assert decide_launcher(sft, False, "c.yaml") == "torchrun"  # auto falls back only for torchrun programs
    ray_job = load_job(write_job(tmp_path, "name: s\ncommand: [python, x.py]\nlauncher: ray\n"))
    with pytest.raises(ClusterError, match="launcher is ray"):
        decide_launcher(ray_job, False, "c.yaml")


def test_backend_env_merge_and_config_fallback(cluster):
    assert config_interface_env(cluster) == {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5"}
    env, warnings = BackendEnv({"a": {"NCCL_SOCKET_IFNAME": "ens5", "UCX_TLS": "rc"},
                                "b": {"NCCL_SOCKET_IFNAME": "ens6", "UCX_TLS": "tcp"}}, "t").merged()
    assert env == {}  # per-node values stay with each node's Ray (from `up`), never one value for all
    assert [w.split(" ")[0] for w in warnings] == ["NCCL_SOCKET_IFNAME", "UCX_TLS"]
    assert "ens5, ens6" in warnings[0]
    env, warnings = BackendEnv({"a": {"NCCL_IB_DISABLE": "1", "X": "1"}, "b": {"NCCL_IB_DISABLE": "1"}}, "t").merged()
    assert env == {"NCCL_IB_DISABLE": "1"} and len(warnings) == 1


def test_shipped_job_files_parse():
    for name in ("smoke.yaml", "sft_gsm8k.yaml"):
        p = ROOT / "launch" / name
        if p.exists():
            assert load_job(p).name


def test_python_gc_freeze_ships_the_hook_to_every_worker(tmp_path, cluster):
    """python_gc: auto (the default) and freeze -> Ray's worker_process_setup_hook runs vc_hooks.setup in each worker,
    the module shipped as py_modules (the nodes need not have verl_cluster); the job's own py_modules are kept. With
    the job's own hook, auto leaves it alone and freeze is refused; `default` ships nothing."""
    text = "name: g\nentrypoint: verl.trainer.main_ppo\nruntime_env: {py_modules: [/srv/mine]}\n"
    plain = build_ray_request(load_job(write_job(tmp_path, text), ["python_gc=default"]), cluster, {}, {}, {})
    assert "worker_process_setup_hook" not in plain.runtime_env and "VERL_CLUSTER_GC" not in plain.runtime_env["env_vars"]
    assert plain.runtime_env["py_modules"] == ["/srv/mine"]
    for words in ([], ["python_gc=freeze"]):
        env = build_ray_request(load_job(write_job(tmp_path, text), words), cluster, {}, {}, {}).runtime_env
        assert env["worker_process_setup_hook"] == "vc_hooks.setup" and env["env_vars"]["VERL_CLUSTER_GC"] == "freeze"
        mine, hooks = env["py_modules"]
        assert mine == "/srv/mine" and Path(hooks).name == "vc_hooks" and (Path(hooks) / "__init__.py").is_file()
        assert "verl_cluster" not in (Path(hooks) / "__init__.py").read_text().split('"""')[2]  # imports none of ours
    auto_own = load_job(write_job(tmp_path, text), ["runtime_env.worker_process_setup_hook=m.f"])
    env = build_ray_request(auto_own, cluster, {}, {}, {}).runtime_env
    assert env["worker_process_setup_hook"] == "m.f" and env["py_modules"] == ["/srv/mine"]
    assert "VERL_CLUSTER_GC" not in env["env_vars"]
    assert build_torchrun_request(auto_own, cluster, {}, {}, {}).nodes  # auto asks nothing of torchrun
    # verl's ray.init given py_modules of its own: Ray would refuse to merge the two runtime_envs, so auto does not
    for words in (["+ray_kwargs.ray_init.runtime_env.py_modules=[/x]"],
                  ["ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=m.f"]):
        env = build_ray_request(load_job(write_job(tmp_path, text), words), cluster, {}, {}, {}).runtime_env
        assert "worker_process_setup_hook" not in env and "VERL_CLUSTER_GC" not in env["env_vars"], words
    own = load_job(write_job(tmp_path, text + "python_gc: freeze\n"), ["runtime_env.worker_process_setup_hook=m.f"])
    with pytest.raises(ConfigError, match="worker_process_setup_hook is set") as e:
        build_ray_request(own, cluster, {}, {}, {})
    assert "gc.freeze()" in e.value.hint
    with pytest.raises(ConfigError, match="torchrun has no such hook"):
        build_torchrun_request(own, cluster, {}, {}, {})
    with pytest.raises(ConfigError, match="python_gc") as e:
        load_job(write_job(tmp_path, text + "python_gc: frozen\n"))
    assert "freeze" in str(e.value) + (e.value.hint or "")
