"""A Megatron job (verl's ppo_megatron_trainer config) gets no memory verdict and no FSDP keys from the planner."""

import json
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.job import load_job
from verl_cluster.jobs.request import merge_overrides
from verl_cluster.verl_scripts.script_import import load_job_input
from verl_cluster.placement import parse_gpus
from verl_cluster.placement.length_plans import plan_lengths
from verl_cluster.placement.lengths import resolve_lengths
from verl_cluster.placement.plan import plan as plan_job
from verl_cluster.placement.settings import uses_megatron

ROOT = Path(__file__).resolve().parents[2]

# the command line of a Qwen3-8B Megatron recipe, as a user gives it to `plan --`
MEGATRON_ARGV = [
    "python3", "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer.yaml",
    "algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=Qwen/Qwen3-8B", "model.catalog=qwen3-8b",
    "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
]
FSDP_MARKERS = ("fsdp_config", "critic.fsdp", "micro_batch_size", "gpu_memory_utilization",
                "tensor_model_parallel_size", "max_token_len")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def test_plan_json_says_not_covered_and_emits_only_node_counts(capsys):
    rc = main(["plan", "--json", "--gpus", "1x8xH100-80GB", "--"] + MEGATRON_ARGV)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["memory_verdict"] == "not-covered" and doc["verdict"] == "not-covered"
    assert "does not cover Megatron" in doc["not_covered"]
    assert doc["overrides"] == {"trainer.nnodes": 1, "trainer.n_gpus_per_node": 8}
    assert not any(m in k for k in doc["overrides"] for m in FSDP_MARKERS)
    assert doc["problems"] == [] and doc["options"] == []
    assert doc["not_applied"] == []  # nothing was proposed that the job then drops


def test_plan_text_says_so_first(capsys):
    assert main(["plan", "--brief", "--gpus", "1x8xH100-80GB", "--"] + MEGATRON_ARGV) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "memory not checked" in first and "fits" not in first.split("—")[0]


def test_an_fsdp_job_too_big_is_not_refused_when_it_runs_on_megatron():
    """The FSDP model's 'does not fit' says nothing about Megatron's sharding: no refusal, the FSDP figures as
    warnings labelled so."""
    argv = [a if a != "model.catalog=qwen3-8b" else "model.catalog=llama-3.1-70b" for a in MEGATRON_ARGV]
    job, _ = load_job_input(argv[0], argv[1:])
    p = plan_job(job, parse_gpus("1x8xL4-24GB"))
    assert p.feasible and p.not_covered and not p.problems
    assert any(w.startswith("FSDP model, not Megatron's:") for w in p.warnings)


@pytest.mark.parametrize("extra", [
    ["--config-name", "ppo_megatron_trainer"],
    ["-cn=ppo_megatron_trainer"],
    ["actor_rollout_ref.actor.strategy=megatron"],
    ["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"],
])
def test_every_spelling_of_megatron_is_seen(extra):
    job, _ = load_job_input("python3", ["-m", "verl.trainer.main_ppo", "model.catalog=qwen2.5-0.5b"] + extra)
    assert uses_megatron(job)


def test_fsdp_jobs_are_unchanged():
    job = load_job(str(ROOT / "launch/gsm8k_grpo.yaml"))
    assert not uses_megatron(job)
    plans = plan_lengths(job, parse_gpus("1x8xH100-80GB"), resolve_lengths(job))
    assert plans.verdict == "fits" and not plans.chosen.not_covered
    assert any("fsdp_config" in k for k in plans.chosen.overrides)


def test_submit_side_gets_no_verdict_and_no_fsdp_keys(monkeypatch):
    """submit/integrations.placement_plan: feasible None (a warning, not a refusal), the node counts only."""
    from verl_cluster.submit import integrations

    job, _ = load_job_input(MEGATRON_ARGV[0], MEGATRON_ARGV[1:])
    monkeypatch.setattr(integrations, "_facts_and_lengths",
                        lambda job, spec, facts: (parse_gpus("1x8xH100-80GB"), resolve_lengths(job), []))
    info = integrations.placement_plan(job, spec=None)
    assert info.feasible is None and "does not cover Megatron" in info.note and info.unplanned
    assert set(info.overrides) == {"trainer.nnodes", "trainer.n_gpus_per_node"}
    merged, skipped = merge_overrides(job, info.overrides)
    assert skipped == [] and not any("fsdp" in k for k in merged)

