"""verl's own example scripts (tests/fixtures/verl_scripts, source and commit in each header) through import,
plan on hypothetical H100s and verl's config check (offline: verl composes its Hydra config here)."""

from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.errors import ConfigError
from verl_cluster.submit.integrations import placement_plan
from verl_cluster.submit.preflight import check_verl
from verl_cluster.jobs.request import merge_overrides
from verl_cluster.verl_scripts.script_import import import_script
from verl_cluster.submit.verl_config import verl_available, verl_python
from verl_cluster.placement import parse_gpus, plan_job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verl_scripts"
ENV = {"HOME": "/home/u"}
# script -> (trainer.nnodes, the catalog model the planner suggests when the script's model is not in the catalog;
# None: the catalog has it - every model these examples use is there now, Qwen2 and Qwen2.5-Math included)
GOOD = {
    "run_qwen3-8b.sh": (1, None),  # GRPO on GSM8K, a catalog model
    "run_qwen2-7b.sh": (1, None),  # GRPO on GSM8K, Qwen/Qwen2-7B-Instruct
    "run_deepseek_math_gsm8k_megatron.sh": (1, None),  # PPO with a critic, Megatron workers, an export
    "run_qwen2-7b_sgl_megatron.sh": (1, None),  # SGLang rollout, Megatron
    "test_dapo_7b_math.sh": (8, None),  # ${NNODES:-8}, nested defaults, $((...)), a local model path (Qwen2.5-Math-7B)
    "qwen2-70b_grpo_32_h800_fsdp_vllm.sh": (4, None),  # 4 nodes, rollout TP 16, Qwen/Qwen2-72B-Instruct
}


def imported(name):
    return import_script(FIXTURES / name, environ=ENV)


def planned(name):
    """(job, plan) on nnodes x 8 x H100-80GB; a model the catalog lacks gets the stand-in the error suggests."""
    nnodes, stand_in = GOOD[name]
    imp = imported(name)
    gpus = parse_gpus(f"{nnodes}x8xH100-80GB")
    job = imp.job()
    if stand_in:
        with pytest.raises(ConfigError) as e:
            plan_job(job, gpus)
        assert "not in the catalog" in e.value.message and f"model.catalog={stand_in}" in e.value.hint
        assert "--model-config FILE" in e.value.hint
        job = imp.job([f"model.catalog={stand_in}"])
    return job, plan_job(job, gpus)


def test_every_fixture_names_its_source():
    for p in FIXTURES.glob("*.sh"):
        first = p.read_text().splitlines()[0]
        assert first.startswith("# source: volcengine/verl examples/") and " @ " in first, p.name


@pytest.mark.parametrize("name", GOOD)
def test_imports_to_a_spec_that_loads_back(name, tmp_path):
    imp = imported(name)
    job = imp.job()
    assert job.entrypoint == "verl.trainer.main_ppo" and job.launcher == "ray" and job.model.path
    assert job.data.train_files and int(job.get("trainer.nnodes")) == GOOD[name][0]
    spec = tmp_path / "job.yaml"
    spec.write_text(imp.to_yaml())
    back = load_job(spec)
    assert back.verl_overrides() == job.verl_overrides() and back.args == job.args and back.env == job.env


def test_what_the_fixtures_carry():
    meg = imported("run_deepseek_math_gsm8k_megatron.sh").job()
    assert meg.args == ["--config-path=./config", "--config-name=ppo_megatron_trainer"]
    assert meg.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} and meg.get("algorithm.adv_estimator") == "gae"
    assert meg.data.train_files == ["/home/u/data/gsm8k/train.parquet", "/home/u/data/math/train.parquet"]
    dapo = imported("test_dapo_7b_math.sh")
    job = dapo.job()
    assert job.model.path == "/home/u/verl/models/Qwen2.5-Math-7B" and job.get("trainer.n_gpus_per_node") == 8
    assert job.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu") == 20480  # ((2048 + 8192) * 2)
    assert job.get("+reward_model.reward_kwargs.overlong_buffer_cfg.len") == 4096
    assert dapo.origins[("overrides", "trainer.nnodes")] == 131
    env = {**ENV, "NNODES": "2"}  # bash takes ${NNODES:-8} from the shell when it is set there
    assert import_script(FIXTURES / "test_dapo_7b_math.sh", environ=env).job().get("trainer.nnodes") == 2


@pytest.mark.parametrize("name", GOOD)
def test_plans_on_hypothetical_gpus(name):
    job, plan = planned(name)
    assert plan.nnodes == GOOD[name][0] and plan.gpus_per_node == 8
    assert plan.overrides and plan.reasons
    _, skipped = merge_overrides(job, plan.overrides)
    for n in skipped:  # the script's own settings win; each suggestion left out says why
        assert n.reason.startswith("you set ") or "Megatron" in n.reason


def test_megatron_and_pinned_token_budgets_are_not_overridden():
    job, plan = planned("run_deepseek_math_gsm8k_megatron.sh")
    merged, skipped = merge_overrides(job, plan.overrides)
    assert not any("fsdp" in k for k in merged) and "critic.forward_micro_batch_size_per_gpu" not in merged
    # the plan of a Megatron job proposes no FSDP key at all (its memory verdict does not cover Megatron)
    assert plan.not_covered and not any("fsdp" in k for k in plan.overrides)
    assert not any("fsdp" in n.key for n in skipped)
    job, plan = planned("test_dapo_7b_math.sh")
    merged, skipped = merge_overrides(job, plan.overrides)
    assert merged["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == 30720  # the script's value
    key = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
    if plan.overrides.get(key) != 30720:
        assert any(n.key == key and "test_dapo_7b_math.sh:91" in n.reason for n in skipped)


def test_scripts_models_are_planned_as_themselves():
    for name, shape in [("run_qwen2-7b.sh", "qwen2-7b"), ("qwen2-70b_grpo_32_h800_fsdp_vllm.sh", "qwen2-72b"),
                        ("test_dapo_7b_math.sh", "qwen2.5-math-7b")]:
        assert planned(name)[1].model == shape, name


def test_submit_runs_an_unknown_model_unplanned_with_a_warning():
    job = imported("run_qwen2-7b.sh").job(["model.path=acme/Widget-7B-Instruct"])
    info = placement_plan(job, spec=None)  # no shape: it returns before touching any node
    assert info.feasible is None and info.overrides == {}
    assert "no placement plan" in info.note and "--model-config FILE" in info.unplanned


@pytest.mark.parametrize("name, line, what", [
    ("qwen2-70b_grpo_32_h20_fsdp_vllm.sh", 10, "$data_path is not set"),  # a real bug in that example
    ("run_qwen2.5-3b_gsm8k_multiturn.sh", 12, "a shell function definition"),
    ("run_qwen2-32b_sglang_fsdp_npu.sh", 63, "a bash array"),
])
def test_scripts_beyond_the_subset_fail_with_file_and_line(name, line, what):
    with pytest.raises(ConfigError) as e:
        imported(name)
    assert e.value.message.startswith(f"{FIXTURES / name}:{line}: ") and what in e.value.message
    assert e.value.hint


verl_here = pytest.mark.skipif(not verl_available(verl_python()), reason="verl is not importable here")


@verl_here
@pytest.mark.parametrize("name", GOOD)
def test_passes_verls_config_check_with_the_plan(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline, as preflight runs without the model
    job, plan = planned(name)
    findings = check_verl(job, merge_overrides(job, plan.overrides)[0])
    assert [f.message for f in findings if f.level == "error"] == []
    assert any(f.level == "ok" for f in findings)


@verl_here
def test_an_older_scripts_renamed_keys_are_caught(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    job = imported("run_deepseek7b_llm.sh").job()
    findings = [f for f in check_verl(job, job.verl_overrides()) if f.level == "error"]
    assert {f.message for f in findings} >= {"unknown verl key `critic.model.fsdp_config.param_offload`"}
    assert any(f.hint == "did you mean `critic.fsdp.param_offload`?" for f in findings)
