"""verl scripts and `python3 -m verl...` command lines as job specs; the user's overrides beat the planner's."""

from pathlib import Path

import pytest
import yaml

from verl_cluster.cli import main
from verl_cluster.config.job import JobSpec, load_job
from verl_cluster.errors import ConfigError
from verl_cluster.verl_scripts.hydra_values import from_hydra
from verl_cluster.jobs.request import merge_overrides, program_argv, torchrun_program
from verl_cluster.verl_scripts.script_import import import_argv, import_script, load_job_input

ENV = {"HOME": "/home/u"}


def script(tmp_path: Path, text: str, name: str = "run.sh") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def bad(tmp_path: Path, text: str, environ=None) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        import_script(script(tmp_path, text), environ=ENV if environ is None else environ)
    return e.value


BASIC = """#!/bin/bash
set -xeuo pipefail
# a comment
export VLLM_USE_V1=1
nnodes=${NNODES:-2}
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
max_prompt=$((1024 * 2))
files="['$HOME/a.parquet', '$HOME/b.parquet']"

HYDRA_FULL_ERROR=1 python3 -m verl.trainer.main_ppo --config-name='ppo_trainer'\\
    algorithm.adv_estimator=grpo \\
    data.train_files="$files" \\
    data.val_files=$RAY_DATA_HOME/test.parquet \\
    data.max_prompt_length=$max_prompt \\
    data.max_response_length=$(( (max_prompt + 2048) / 2 )) \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    trainer.logger='["console","wandb"]' \\
    trainer.project_name='my project' \\
    trainer.nnodes=$nnodes \\
    trainer.nnodes=3 \\
    +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \\
    trainer.total_epochs=15 "$@"
"""


def test_a_script_becomes_the_spec_a_yaml_would_be(tmp_path):
    imp = import_script(script(tmp_path, BASIC), environ=ENV)
    d = imp.data
    assert d["name"] == "run" and d["entrypoint"] == "verl.trainer.main_ppo" and d["launcher"] == "ray"
    assert d["args"] == ["--config-name=ppo_trainer"]  # the quote and the `\` right after it, as bash reads them
    assert d["model"] == {"path": "Qwen/Qwen2.5-0.5B-Instruct"}
    assert d["data"] == {"train_files": ["/home/u/a.parquet", "/home/u/b.parquet"],
                         "val_files": ["/home/u/verl/test.parquet"]}
    assert d["env"] == {"VLLM_USE_V1": "1", "HYDRA_FULL_ERROR": "1"}
    ov = d["overrides"]
    assert "critic.model.path" not in ov  # model.path sets it
    assert ov["data.max_prompt_length"] == 2048 and ov["data.max_response_length"] == 2048
    assert ov["actor_rollout_ref.actor.optim.lr"] == 1e-6 and ov["trainer.logger"] == ["console", "wandb"]
    assert ov["trainer.project_name"] == "my project"
    assert ov["trainer.nnodes"] == 3  # the later one wins, as in Hydra
    assert ov["+actor_rollout_ref.model.override_config.max_position_embeddings"] == 32768
    assert imp.origins[("overrides", "trainer.nnodes")] == 22 and imp.origins[("model", "path")] == 16
    assert imp.origins[("env", "VLLM_USE_V1")] == 4 and imp.takes_args
    assert imp.from_shell == {"HOME": 6}


def test_the_imported_yaml_loads_to_the_same_job(tmp_path):
    imp = import_script(script(tmp_path, BASIC), environ=ENV)
    text = imp.to_yaml()
    assert "  trainer.nnodes: 3  # run.sh:22" in text and "  path: Qwen/Qwen2.5-0.5B-Instruct  # run.sh:16" in text
    assert "$HOME was taken from this shell's environment (first used on line 6)" in text
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    a, b = load_job(spec, ["trainer.nnodes=4"]), imp.job(["trainer.nnodes=4"])
    for f in ("name", "entrypoint", "launcher", "args", "model", "data", "env", "secrets", "overrides"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.get("trainer.nnodes") == 4 and a.get("critic.model.path") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_unset_variables_come_from_this_shell_or_are_named(tmp_path):
    text = "python3 -m verl.trainer.main_ppo \\\n  data.train_files=$DATA/train.parquet\n"
    imp = import_script(script(tmp_path, text), environ={"DATA": "/data"})
    assert imp.data["data"]["train_files"] == ["/data/train.parquet"] and imp.from_shell == {"DATA": 2}
    e = bad(tmp_path, text, environ={})
    assert e.message.startswith(f"{tmp_path / 'run.sh'}:2: $DATA is not set") and "export DATA=" in e.hint


@pytest.mark.parametrize("text, line, what", [
    ("x=1\nif [ $x = 1 ]; then\n  echo hi\nfi\n", 2, "shell logic (`if`)"),
    ("for i in 1 2; do\n echo $i\ndone\n", 1, "shell logic (`for`)"),
    ("function now() {\n date\n}\n", 1, "a shell function definition"),
    ("(cd /tmp && ls)\n", 1, "a subshell"),
    ("CFG=(\n a=1\n)\n", 1, "a bash array"),
    ("python3 -m verl.trainer.main_ppo a=1 2>&1 | tee log.txt\n", 1, "a redirection"),
    ("python3 -m verl.trainer.main_ppo a=1 | tee log.txt\n", 1, "a pipe"),
    ("x=$(nvidia-smi -L | wc -l)\n", 1, "command substitution `$(nvidia-smi -L | wc -l)`"),
    ("python3 -m verl.trainer.main_ppo a=1\npython3 -m verl.trainer.main_generation b=2\n", 2,
     "a second python command (the first is on line 1)"),
    ("mkdir -p logs\npython3 -m verl.trainer.main_ppo a=1\n", 1, "`mkdir` is a command this importer does not run"),
    ("python3 -c 'import train' a=1\n", 1, "only `python -m MODULE ...`"),
    ("python3 -m verl.trainer.main_ppo \\\n  notakeyvalue\n", 2, "`notakeyvalue` is not a key=value override"),
    ("python3 -m verl.trainer.main_ppo a=${x:?set x first}\n", 1, "$x is not set: set x first"),
    ("python3 -m verl.trainer.main_ppo a=${x/a/b}\n", 1, "only ${VAR}"),
    ("python3 -m verl.trainer.main_ppo a='open\n", 1, "unterminated single quote"),
])
def test_what_the_importer_cannot_understand_is_named_with_its_line(tmp_path, text, line, what):
    e = bad(tmp_path, text)
    assert e.message.startswith(f"{tmp_path / 'run.sh'}:{line}: ") and what in e.message, e.message
    assert e.hint


def test_no_python_line_is_an_error(tmp_path):
    e = bad(tmp_path, "set -x\nexport A=1\n")
    assert "no `python3 -m MODULE ...` line" in e.message


def test_secrets_are_never_written(tmp_path):
    text = ("export WANDB_API_KEY=wandb-secret-123\nexport HF_TOKEN\n"
            "python3 -m verl.trainer.main_ppo +reward.api_key=$OPENAI_API_KEY trainer.max_token_len=$max_token_len\n")
    imp = import_script(script(tmp_path, text), environ={"HF_TOKEN": "hf-secret", "OPENAI_API_KEY": "sk-secret",
                                                         "max_token_len": "4096"})
    text_out = imp.to_yaml()
    for secret in ("wandb-secret-123", "hf-secret", "sk-secret"):
        assert secret not in text_out
    assert imp.data["secrets"] == ["WANDB_API_KEY", "HF_TOKEN", "OPENAI_API_KEY"]
    assert "env" not in imp.data
    assert imp.data["overrides"]["+reward.api_key"] == "${oc.env:OPENAI_API_KEY}"  # verl reads the job's env
    assert imp.data["overrides"]["trainer.max_token_len"] == 4096  # `token` inside a name is not a secret
    assert imp.secret_values == {"WANDB_API_KEY": "wandb-secret-123", "HF_TOKEN": "hf-secret",
                                 "OPENAI_API_KEY": "sk-secret"}


@pytest.mark.parametrize("raw, value", [
    ("1024", 1024), ("1e-6", 1e-6), ("-1", -1), ("0.80", 0.8), ("True", True), ("false", False), ("null", None),
    ("'error'", "error"), ('["console","wandb"]', ["console", "wandb"]),
    ("['/a.parquet', '/b.parquet']", ["/a.parquet", "/b.parquet"]), ("{a:1,b:x}", {"a": 1, "b": "x"}),
    ("Qwen/Qwen2-7B-Instruct", "Qwen/Qwen2-7B-Instruct"), ("${oc.env:X}", "${oc.env:X}"),
])
def test_hydra_values(raw, value):
    assert from_hydra(raw) == value


def test_a_command_line_is_a_job_too():
    imp = import_argv(["python3", "-m", "verl.trainer.main_ppo", "data.train_files=/d/train.parquet",
                       "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "trainer.nnodes=2",
                       "trainer.experiment_name=exp1"])
    job = imp.job()
    assert job.name == "exp1" and job.source == "<command line>" and job.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert job.data.train_files == ["/d/train.parquet"] and job.get("trainer.nnodes") == 2
    job2, imp2 = load_job_input("python3", ["-m", "verl.trainer.main_ppo", "trainer.nnodes=2"])
    assert imp2 is not None and job2.entrypoint == "verl.trainer.main_ppo"


def test_a_program_that_is_not_verl_gets_its_own_words_as_given(tmp_path, capsys):
    words = ["--lr", "3e-4", "--name", "a b", "pos", "key=value", "--flag=x", "-v"]
    job, _ = load_job_input("python3", ["-u", "-m", "mymod", *words])
    assert job.entrypoint == "mymod" and job.args == words and job.overrides == {} and job.name == "mymod"
    assert program_argv(job, "/venv/bin/python", {}) == ["/venv/bin/python", "-m", "mymod", *words]
    job = import_argv(["python", "train.py", *words]).job()
    assert job.command == ["python", "train.py"] and job.args == words and job.name == "train"
    assert torchrun_program(job, {}) == ["train.py", *words]
    job = import_script(script(tmp_path, 'python3 -m mymod --epochs 3 "$@"\n'), environ=ENV).job()
    assert job.args == ["--epochs", "3"] and job.overrides == {}
    assert main(["import", "--", "python3", "-m", "mymod", "--epochs", "3"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text)["args"] == ["--epochs", "3"] and "the program's own, passed as given" in text


def test_a_program_whose_words_are_all_overrides_is_read_as_hydra():
    """A Hydra app (or the product's stand-in job) takes key=value words: submit and watch read them (the checkpoint
    folder a watched run needs, the world it runs on); one word that is not key=value keeps them all as given."""
    job, _ = load_job_input("python3", ["-m", "resumable_job", "trainer.default_local_dir=/ckpt", "trainer.nnodes=2"])
    assert job.args == [] and job.get("trainer.default_local_dir") == "/ckpt" and job.get("trainer.nnodes") == 2
    job = import_argv(["python", "train.py", "trainer.save_freq=2"]).job()
    assert job.get("trainer.save_freq") == 2 and torchrun_program(job, job.overrides) == ["train.py", "trainer.save_freq=2"]
    job, _ = load_job_input("python3", ["-m", "mymod", "a.b=1", "--lr", "1"])
    assert job.args == ["a.b=1", "--lr", "1"] and job.overrides == {}


def test_verls_argparse_tools_get_their_words_as_given():
    """verl.model_merger parses argparse flags (verl/model_merger/__main__.py): not read as Hydra overrides."""
    from verl_cluster.config.job import takes_hydra_overrides

    words = ["merge", "--backend", "fsdp", "--local_dir", "/ckpt/global_step_4/actor", "--target_dir", "/hf"]
    job, _ = load_job_input("python3", ["-m", "verl.model_merger", *words])
    assert job.entrypoint == "verl.model_merger" and job.args == words and job.overrides == {}
    assert takes_hydra_overrides("verl.trainer.main_ppo") and takes_hydra_overrides("verl.trainer.main_generation")
    assert not takes_hydra_overrides("verl.scripts.legacy_model_merger") and not takes_hydra_overrides("mymod")
    assert not takes_hydra_overrides("verl.model_merger") and takes_hydra_overrides("verl.model_mergers_x")


def test_verl_command_lines_are_still_read_as_hydra_overrides():
    with pytest.raises(ConfigError, match="`--lr` is not a key=value override"):
        import_argv(["python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2", "--lr", "1"])
    job = import_argv(["python3", "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer",
                       "trainer.nnodes=2"]).job()
    assert job.args == ["--config-name=ppo_megatron_trainer"] and job.get("trainer.nnodes") == 2


def test_plan_of_another_program_says_it_reads_nothing_from_its_words(capsys):
    rc = main(["plan", "--gpus", "1x1xH100-80GB", "model.catalog=qwen2.5-0.5b", "--brief", "--",
               "python3", "-m", "mymod", "--lr", "1", "--epochs=2"])
    err = capsys.readouterr().err
    assert rc in (0, 1) and "error" not in err
    assert "`mymod` is not verl's: its arguments go to it as given and the planner reads nothing from them" in err


# ---- the planner never beats the user's own keys ----
def _job(overrides, args=()):
    return JobSpec(name="j", entrypoint="verl.trainer.main_ppo", overrides=overrides, args=list(args))


def test_user_keys_win_over_the_planner_and_the_rest_is_said():
    job = _job({"actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
                "++actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
                "actor_rollout_ref.actor.ppo_micro_batch_size": 64, "trainer.nnodes": 2})
    plan = {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
            "+actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8, "trainer.nnodes": 2,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": 1}
    merged, skipped = merge_overrides(job, plan)
    assert merged["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6
    assert "+actor_rollout_ref.model.override_config.attn_implementation" not in merged  # one spelling reaches Hydra
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" not in merged  # verl refuses both forms
    assert merged["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 1
    why = {n.key: n.reason for n in skipped}
    assert set(why) == {"actor_rollout_ref.rollout.gpu_memory_utilization",
                        "+actor_rollout_ref.model.override_config.attn_implementation",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"}  # equal values are no conflict
    assert why["actor_rollout_ref.rollout.gpu_memory_utilization"].startswith(
        "you set actor_rollout_ref.rollout.gpu_memory_utilization=0.6")
    assert why["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"].endswith("verl refuses both")


def test_the_reason_names_the_script_line_and_the_command_line(tmp_path):
    p = script(tmp_path, "python3 -m verl.trainer.main_ppo \\\n  actor_rollout_ref.rollout.n=5 \\\n"
                         "  actor_rollout_ref.rollout.gpu_memory_utilization=0.6\n")
    job, _ = load_job_input(str(p), ["actor_rollout_ref.rollout.n=8"])
    _, skipped = merge_overrides(job, {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.4})
    assert skipped[0].reason == f"you set actor_rollout_ref.rollout.gpu_memory_utilization=0.6 ({p}:3)"
    job, _ = load_job_input("python3", ["-m", "verl.trainer.main_ppo", "trainer.nnodes=2"])
    assert merge_overrides(job, {"trainer.nnodes": 1})[1][0].reason == "you set trainer.nnodes=2 (the command line)"


def test_yaml_jobs_name_their_file_line(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\nentrypoint: verl.trainer.main_ppo\noverrides:\n  trainer:\n    nnodes: 2\n")
    _, skipped = merge_overrides(load_job(spec), {"trainer.nnodes": 1})
    assert skipped[0].reason == f"you set trainer.nnodes=2 ({spec}:5)"


def test_megatron_jobs_get_no_fsdp_keys():
    job = _job({}, ["--config-name=ppo_megatron_trainer"])
    merged, skipped = merge_overrides(job, {"actor_rollout_ref.actor.fsdp_config.param_offload": False,
                                            "critic.fsdp.optimizer_offload": False,
                                            "critic.forward_micro_batch_size_per_gpu": 8,
                                            "actor_rollout_ref.rollout.tensor_model_parallel_size": 2})
    assert merged == {"actor_rollout_ref.rollout.tensor_model_parallel_size": 2}
    assert len(skipped) == 3 and all("Megatron" in n.reason for n in skipped)


# ---- the CLI ----
def test_import_cli_writes_yaml_and_bad_input_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    assert main(["import", str(script(tmp_path, BASIC))]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["overrides"]["trainer.nnodes"] == 3 and doc["env"]["VLLM_USE_V1"] == "1"
    assert main(["import", str(script(tmp_path, "python3 -m verl.trainer.main_ppo a=1 | tee x\n", "b.sh"))]) == 2
    e = capsys.readouterr().err
    assert "b.sh:1: a pipe (`|`) is not understood" in e and "Traceback" not in e
    assert main(["import", "--json", "--", "python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2"]) == 0
    assert '"trainer.nnodes": 2' in capsys.readouterr().out


def test_plan_cli_takes_a_script_and_says_what_it_did_not_apply(tmp_path, capsys):
    import json

    p = script(tmp_path, "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\\n"
                         "  actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \\\n"
                         "  +actor_rollout_ref.model.override_config.attn_implementation=eager\n")
    rc = main(["plan", str(p), "--gpus", "1x1xP40-24GB", "--json"])  # SM 6.1: the planner wants eager too
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and doc["model"]["name"] == "qwen2.5-0.5b" and doc["not_applied"] == []
    rc = main(["plan", "--gpus", "1x1xH100-80GB", "--json", "--", "python3", "-m", "verl.trainer.main_ppo",
               "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "algorithm.adv_estimator=grpo",
               "actor_rollout_ref.actor.use_dynamic_bsz=true",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and [n["key"] for n in doc["not_applied"]] == [
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
    assert doc["not_applied"][0]["reason"] == ("you set actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720 "
                                               "(the command line)")
