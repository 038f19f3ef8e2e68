"""Run hygiene (submit/hygiene.py): checkpoints saved where no one looks, wandb with no login on the nodes, and the
line that resumes a run by hand."""

import shlex
from pathlib import Path

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import JobSpec
from verl_cluster.submit import preflight
from verl_cluster.submit.hygiene import (checkpoint_dir_findings, resume_command, resume_hint, wandb_findings,
                                         wandb_unknown, wants_wandb)
from verl_cluster.submit.job_input import JobInput
from verl_cluster.submit.preflight import check_nodes

ROOT = Path(__file__).resolve().parents[2]
PPO = JobSpec(name="gsm8k-ppo", entrypoint="verl.trainer.main_ppo")


def _cluster(tmp_path, text="cluster_name: hy\nhead: {host: localhost}\n"):
    c = tmp_path / "c.yaml"
    c.write_text(text)
    return load_cluster(c)


# ---- trainer.default_local_dir ----
def test_saving_without_a_checkpoint_folder_warns_where_verl_puts_them():
    (w,) = checkpoint_dir_findings(PPO, {"trainer.save_freq": 5})
    assert (w.level, w.check) == ("warning", "checkpoint")
    assert w.message.startswith("trainer.default_local_dir is not set: verl saves a checkpoint every 5 step(s) under "
                                "checkpoints/${trainer.project_name}/${trainer.experiment_name}, relative to the "
                                "working directory of the job's driver, a Ray temp folder")
    assert w.hint.endswith("trainer.default_local_dir=/shared/ckpt/gsm8k-ppo")
    (rel,) = checkpoint_dir_findings(PPO, {"trainer.save_freq": "5", "trainer.default_local_dir": "ckpt/run1"})
    assert rel.message.startswith("trainer.default_local_dir `ckpt/run1` is a relative path")


def test_no_warning_when_nothing_is_saved_or_the_folder_is_absolute():
    assert checkpoint_dir_findings(PPO, {}) == []  # verl's save_freq -1: no checkpoints
    assert checkpoint_dir_findings(PPO, {"trainer.save_freq": -1}) == []
    assert checkpoint_dir_findings(PPO, {"trainer.save_freq": 5, "trainer.default_local_dir": "/shared/c"}) == []
    assert checkpoint_dir_findings(PPO, {"trainer.save_freq": 5, "trainer.default_local_dir": "~/c"}) == []
    script = JobSpec(name="x", command=["python", "train.py"])
    assert checkpoint_dir_findings(script, {"trainer.save_freq": 5}) == []


# ---- wandb ----
def test_wandb_is_wanted_when_named_or_by_verls_default():
    assert wants_wandb(PPO, {})  # verl's trainer.logger default is [console, wandb]
    assert wants_wandb(PPO, {"trainer.logger": ["console", "wandb"]})
    assert wants_wandb(PPO, {"trainer.logger": "wandb"})
    assert not wants_wandb(PPO, {"trainer.logger": ["console"]})
    assert not wants_wandb(JobSpec(name="x", command=["python", "t.py"]), {})


def test_a_key_in_the_jobs_env_secrets_or_the_clusters_env_needs_no_node_probe(tmp_path):
    spec = _cluster(tmp_path)
    assert wandb_unknown(spec, PPO, {})
    assert not wandb_unknown(spec, JobSpec(name="j", entrypoint="verl.trainer.main_ppo", secrets=["WANDB_API_KEY"]), {})
    assert not wandb_unknown(spec, JobSpec(name="j", entrypoint="verl.trainer.main_ppo",
                                           env={"WANDB_MODE": "offline"}), {})
    env_spec = _cluster(tmp_path, "cluster_name: hy\nhead: {host: localhost}\nray: {env: {WANDB_API_KEY: k}}\n")
    assert not wandb_unknown(env_spec, PPO, {})


def test_nodes_without_a_login_are_named():
    (w,) = wandb_findings({"10.0.0.1": {"wandb_login": True}, "10.0.0.2": {"wandb_login": False},
                           "10.0.0.3": OSError("unreachable")})
    assert (w.level, w.check) == ("warning", "env")
    assert "10.0.0.2 has no wandb login: wandb.init fails when the trainer starts" in w.message
    assert "secrets: [WANDB_API_KEY]" in w.hint
    assert wandb_findings({"h": {"wandb_login": True}}) == []


def test_the_real_probe_reads_the_nodes_netrc(tmp_path, monkeypatch):
    """node_files on a localhost cluster: no key and no ~/.netrc is a warning; `wandb login`'s netrc entry is a
    login."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    spec = _cluster(tmp_path)
    found, _ = check_nodes(spec, PPO, {"trainer.logger": ["console", "wandb"]})
    assert [f.check for f in found if f.level == "warning"] == ["env"], found
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    found, _ = check_nodes(spec, PPO, {"trainer.logger": ["console", "wandb"]})
    assert not [f for f in found if f.level == "warning"], found


def test_run_preflight_carries_both_warnings(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(preflight, "check_verl", lambda job, overrides: [])
    report = preflight.run_preflight(_cluster(tmp_path), PPO, {"trainer.save_freq": 2}, None)
    assert sorted(f.check for f in report.findings if f.level == "warning") == ["checkpoint", "env"]


def test_run_preflight_runs_its_checks_side_by_side(tmp_path, monkeypatch):
    """verl's config probe (a child Python importing verl: ~30 s on a GPU box) does not wait for the other checks:
    two checks that each wait for the other at a barrier both pass, and the findings keep the checks' order."""
    import threading

    from verl_cluster.submit.findings import Finding

    monkeypatch.setenv("HOME", str(tmp_path))
    barrier = threading.Barrier(2, timeout=20)

    def meet(name):
        def check(*args, **kwargs):
            barrier.wait()
            return [Finding("ok", name, "met the other check")]
        return check

    monkeypatch.setattr(preflight, "check_verl", meet("verl-config"))
    monkeypatch.setattr(preflight, "check_resources", meet("resources"))
    report = preflight.run_preflight(_cluster(tmp_path), PPO, {}, None)
    assert not [f for f in report.findings if f.check == "preflight"], report.findings
    names = [f.check for f in report.findings]
    assert names.index("verl-config") < names.index("resources")


# ---- the resume line ----
def test_resume_line_for_a_job_file_replaces_the_users_resume_mode(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("x")
    ji = JobInput("spec", path="/jobs/gsm8k.yaml", overrides=("trainer.total_epochs=3", "trainer.resume_mode=disable"))
    line = resume_command(ji, str(cluster))
    assert shlex.split(line) == ["verl-cluster", "submit", "/jobs/gsm8k.yaml", "trainer.total_epochs=3",
                                 "trainer.resume_mode=auto", "-c", str(cluster.resolve())]


def _parsed_by_the_cli(line, monkeypatch):
    """The JobInput `verl-cluster submit` makes of a printed line (the real parser; nothing runs)."""
    from verl_cluster.cli import main, submit_cmd

    got = {}

    def capture(args):
        got["input"] = JobInput.from_words(args.job, list(args.overrides or []), getattr(args, "before", []))
        got["cluster"] = args.cluster
        return 0

    monkeypatch.setattr(submit_cmd, "run_submit", capture)
    words = shlex.split(line)
    assert words[:2] == ["verl-cluster", "submit"]
    assert main(words[1:]) == 0
    return got["input"], got["cluster"]


def test_resume_line_for_a_command_line_puts_the_key_at_the_programs_end(monkeypatch):
    typed = JobInput.from_words("watch.max_restarts=2", ["python3", "-m", "verl.trainer.main_ppo",
                                                         "data.train_files=[/d/t.parquet]",
                                                         "+trainer.resume_mode=disable", "trainer.experiment_name=my run"])
    line = resume_command(typed, "nowhere.yaml")
    assert line == ("verl-cluster submit -c nowhere.yaml watch.max_restarts=2 -- python3 -m verl.trainer.main_ppo "
                    "'data.train_files=[/d/t.parquet]' 'trainer.experiment_name=my run' trainer.resume_mode=auto")
    again, cluster = _parsed_by_the_cli(line, monkeypatch)
    assert cluster == "nowhere.yaml" and again.overrides == ("watch.max_restarts=2",)
    job = again.job()
    assert job.get("trainer.resume_mode") == "auto" and job.get("trainer.experiment_name") == "my run"
    assert job.watch.max_restarts == 2


def test_resume_line_of_a_job_file_parses_back_from_another_directory(tmp_path, monkeypatch):
    typed = JobInput.from_words(str(ROOT / "launch/gsm8k.yaml"), ["trainer.save_freq=2"])
    line = resume_command(typed, str(ROOT / "cluster_configs/local.yaml"))
    monkeypatch.chdir(tmp_path)
    again, cluster = _parsed_by_the_cli(line, monkeypatch)
    assert Path(cluster).is_absolute() and Path(again.path).is_absolute()
    job = again.job()
    assert job.get("trainer.resume_mode") == "auto" and job.get("trainer.save_freq") == 2


def test_resume_hint_only_for_runs_that_save_into_an_absolute_folder():
    ji = JobInput("spec", path="/jobs/j.yaml")
    argv = ["python", "-m", "verl.trainer.main_ppo", "trainer.save_freq=2", "trainer.default_local_dir=/ck/j"]
    hint = resume_hint(ji, "c.yaml", argv)
    assert hint.startswith("resume it by hand from its newest checkpoint in /ck/j: verl-cluster submit /jobs/j.yaml "
                           "trainer.resume_mode=auto -c c.yaml")
    assert resume_hint(ji, "c.yaml", argv[:-1]) == ""  # relative default: no folder to resume from
    assert resume_hint(ji, "c.yaml", [w for w in argv if "save_freq" not in w]) == ""  # saves nothing
    assert resume_hint(None, "c.yaml", argv) == ""
