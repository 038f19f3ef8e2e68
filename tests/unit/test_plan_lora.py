"""Issue 13: LoRA in the planner — 7B PPO on 2x8 RTX 4090 fits with LoRA (when the job allows it), a pinned
lora_rank is planned as verl runs it (adapters' grads/Adam only, ref = actor without adapters)."""

from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.config.job import ModelSpec, PlacementSpec, load_job
from verl_cluster.errors import ConfigError
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.settings import read_settings

ROOT = Path(__file__).resolve().parents[2]
PPO = load_job(ROOT / "launch/gsm8k.yaml")
GRPO = load_job(ROOT / "launch/gsm8k_grpo.yaml")
RTX = parse_gpus("1x8xRTX4090-24GB")  # 2x8 fits full fine-tuning at the limit (expandable segments)


def job(base=PPO, catalog="qwen2.5-7b", allow=False, **overrides):
    return replace(base, model=ModelSpec(catalog=catalog), overrides={**base.overrides, **overrides},
                   placement=PlacementSpec(allow_lora=allow))


def test_7b_ppo_on_4090s_says_lora_would_fit_but_does_not_apply_it_unasked():
    p = plan_job(job(), RTX)
    assert not p.feasible and p.binding.startswith("actor update memory")
    # more nodes first: the job takes it as it is (both are about as fast; LoRA must be allowed first)
    assert [o.kind for o in p.options] == ["more nodes", "lora (not allowed)"]
    assert p.options[0].s_per_seq > 0 and p.options[1].s_per_seq > 0
    lora = p.options[1]
    assert "only if you allow it" in lora.changes[0]
    assert "placement.allow_lora=true" in p.fixes[1]
    assert lora.overrides["actor_rollout_ref.model.lora_rank"] == 32


def test_7b_ppo_on_4090s_with_lora_allowed_gets_a_plan_that_fits_when_planned_again():
    p = plan_job(job(allow=True), RTX)
    o = p.options[0]
    assert "not applied" not in o.changes[0] and o.changes[0].startswith("LoRA rank 32")
    assert o.overrides["critic.model.lora_rank"] == 32  # PPO's 7B critic gets adapters too
    again = plan_job(job(**o.overrides), RTX)
    assert again.feasible and again.peak_gib <= again.capacity_gib
    assert any(r.startswith("LoRA on all-linear: actor rank 32") for r in again.reasons)


def test_pinned_lora_plans_adapters_only_and_no_second_ref_model():
    grpo = job(GRPO, **{"actor_rollout_ref.actor.use_kl_loss": True})
    full = plan_job(grpo, parse_gpus("1x8xH100-80GB"))
    lora = plan_job(job(GRPO, **{"actor_rollout_ref.actor.use_kl_loss": True,
                                 "actor_rollout_ref.model.lora_rank": 64}), parse_gpus("1x8xH100-80GB"))
    assert full.feasible and lora.feasible
    # ref: full fine-tuning keeps a CPU-offloaded copy of the model on the host; with LoRA there is none
    assert full.role("ref").host_gib_per_gpu > 1.5 and lora.role("ref").host_gib_per_gpu == 0
    comp = lambda p, phase, name: next(c.gib for r in p.roles for ph in r.phases if ph.phase == phase
                                       for c in ph.components if c.name == name)
    assert comp(lora, "actor update", "adam") < 0.05 * comp(full, "actor update", "adam")
    assert comp(lora, "actor update", "grads") < 0.05 * comp(full, "actor update", "grads")
    assert lora.role("actor").resident_gib < 0.6 * full.role("actor").resident_gib
    assert "actor_rollout_ref.model.lora_rank" not in lora.overrides  # the job's own key stays the job's


def test_lora_settings_spellings():
    s = read_settings(job(**{"actor_rollout_ref.model.lora.rank": 16,
                             "actor_rollout_ref.model.target_modules": ["q_proj", "v_proj"]}))
    assert s.lora_rank == 16 and s.lora_targets == ("q_proj", "v_proj") and s.critic_lora_rank == 0
    assert read_settings(job(**{"actor_rollout_ref.model.target_modules": "[q_proj,k_proj]"})).lora_targets == (
        "q_proj", "k_proj")
    with pytest.raises(ConfigError, match="lora_rank"):
        read_settings(job(**{"actor_rollout_ref.model.lora_rank": -1}))
    with pytest.raises(ConfigError, match="placement.lora_rank"):
        read_settings(replace(job(), placement=PlacementSpec(lora_rank=0)))


def test_lora_on_fewer_targets_uses_fewer_adapter_params():
    a = plan_job(job(GRPO, **{"actor_rollout_ref.model.lora_rank": 64}), parse_gpus("1x8xH100-80GB"))
    b = plan_job(job(GRPO, **{"actor_rollout_ref.model.lora_rank": 64,
                              "actor_rollout_ref.model.target_modules": ["q_proj", "v_proj"]}),
                 parse_gpus("1x8xH100-80GB"))
    adam = lambda p: next(c.gib for ph in p.role("actor").phases if ph.phase == "actor update"
                          for c in ph.components if c.name == "adam")
    assert adam(b) < adam(a)


def test_a_typo_in_our_own_sections_is_an_error_not_a_verl_override():
    from verl_cluster.config.job import load_job as load
    with pytest.raises(ConfigError, match="no field `alow_lora`") as e:
        load(ROOT / "launch/gsm8k.yaml", ["placement.alow_lora=true"])
    assert "placement.allow_lora" in e.value.hint
    with pytest.raises(ConfigError, match="no field `max_restart`") as e:
        load(ROOT / "launch/gsm8k.yaml", ["watch.max_restart=2"])
    assert "watch.max_restarts" in e.value.hint
    assert load(ROOT / "launch/gsm8k.yaml", ["placement.allow_lora=true"]).placement.allow_lora


def test_the_lora_options_overrides_compose_in_verls_own_config(monkeypatch):
    """verl 0.9.1's Hydra config takes every key the LoRA option sets (actor and critic lora_rank included)."""
    from verl_cluster.submit.preflight import check_verl
    from verl_cluster.jobs.request import merge_overrides
    from verl_cluster.submit.verl_config import verl_available, verl_python

    if not verl_available(verl_python()):
        pytest.skip("verl is not importable here")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline, as preflight runs without the model
    o = plan_job(job(allow=True), RTX).options[0]
    lora = job(**o.overrides)
    findings = check_verl(lora, merge_overrides(lora, plan_job(lora, RTX).overrides)[0])
    assert [f.message for f in findings if f.level == "error"] == []
    assert any(f.level == "ok" and "composes" in f.message for f in findings)


def test_a_verl_lora_script_plans_as_lora(tmp_path, capsys):
    """A script in verl's examples' style with LoRA keys: imported, planned with adapters (no ref copy on the host)."""
    import json

    from verl_cluster.cli import main

    script = tmp_path / "run_lora.sh"
    script.write_text("""set -x
MODEL=${MODEL:-Qwen/Qwen2.5-3B-Instruct}
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_batch_size=64 \\
    data.max_prompt_length=512 \\
    data.max_response_length=512 \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.model.lora_rank=64 \\
    actor_rollout_ref.model.lora_alpha=32 \\
    actor_rollout_ref.model.target_modules=all-linear \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.rollout.n=4 \\
    trainer.n_gpus_per_node=2 \\
    trainer.nnodes=1 $@
""")
    rc = main(["plan", str(script), "--gpus", "1x2xRTX4090-24GB", "model.catalog=qwen2.5-3b", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["feasible"], d["binding"]
    assert any(r.startswith("LoRA on all-linear: actor rank 64") for r in d["reasons"])
    assert d["roles"]["ref"]["host_gib_per_gpu"] == 0
