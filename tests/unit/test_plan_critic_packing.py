"""verl 0.9's critic packs its micro batches by tokens whatever critic.ppo_micro_batch_size_per_gpu says (its engine
config keeps use_dynamic_bsz's default; the v1 trainer runs both its passes under
critic.ppo_infer_max_token_len_per_gpu, 32768 unless set). Seen in batch P's traces on 2x H200 (2026-11-28): one
micro batch of 32 sequences a mini batch where the setting said 4. The plan budgets tokens for it, its step time
counts its packed micro batches, and its overrides set the key verl reads."""

from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.settings import read_settings

ROOT = Path(__file__).resolve().parents[2]
PPO = ROOT / "launch/gsm8k.yaml"  # GAE with a critic, verl 0.9 key names
GPUS = "1x2xH100-80GB"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def critic_overrides(plan) -> dict:
    return {k: v for k, v in plan.overrides.items() if "critic" in k and "offload" not in k}


def test_verl_09_critic_is_planned_by_tokens_and_told_the_key_it_reads():
    plan = plan_job(load_job(PPO, []), parse_gpus(GPUS))
    assert plan.feasible
    ov = critic_overrides(plan)
    # one key for both passes (the v1 trainer's), appended: verl 0.9's yaml does not have it
    assert ov["+critic.ppo_infer_max_token_len_per_gpu"] == 32768
    assert "critic.ppo_max_token_len_per_gpu" not in ov and "critic.forward_micro_batch_size_per_gpu" not in ov
    # verl's config check wants a micro batch size set; its engine critic does not use it: one a mini batch
    assert ov["critic.ppo_micro_batch_size_per_gpu"] == 64 // 2
    reasons = " ".join(plan.reasons)
    assert "critic update: token budget 32768" in reasons and "critic values: token budget 32768" in reasons


def test_a_pinned_budget_is_kept_and_more_packed_micro_batches_cost_more():
    pinned = ["+critic.ppo_infer_max_token_len_per_gpu=4096"]
    a = plan_job(load_job(PPO, []), parse_gpus(GPUS), fill=0.5)
    b = plan_job(load_job(PPO, pinned), parse_gpus(GPUS), fill=0.5)
    assert critic_overrides(b)["+critic.ppo_infer_max_token_len_per_gpu"] == 4096
    assert "critic update: token budget 4096" in " ".join(b.reasons)
    # 32 sequences a GPU a mini batch at ~512 real tokens: one micro batch under 32768, four under 4096
    assert b.time["phases_s"]["update_critic"] > a.time["phases_s"]["update_critic"]
    # the micro batch size verl's check wants does not change what is planned
    c = plan_job(load_job(PPO, pinned + ["critic.ppo_micro_batch_size_per_gpu=2"]), parse_gpus(GPUS), fill=0.5)
    assert c.time["phases_s"]["update_critic"] == pytest.approx(b.time["phases_s"]["update_critic"], abs=1e-6)
    assert "critic.ppo_micro_batch_size_per_gpu" not in critic_overrides(c)  # the job's own setting stays


def test_the_critic_micro_batch_setting_no_longer_moves_verl_09_s_plan():
    one = plan_job(load_job(PPO, ["critic.ppo_micro_batch_size_per_gpu=2"]), parse_gpus(GPUS), fill=0.5)
    other = plan_job(load_job(PPO, ["critic.ppo_micro_batch_size_per_gpu=32"]), parse_gpus(GPUS), fill=0.5)
    assert one.time["phases_s"]["update_critic"] == pytest.approx(other.time["phases_s"]["update_critic"])
    assert one.gpus[0].peak_gib == pytest.approx(other.gpus[0].peak_gib)


def test_older_spellings_keep_their_micro_batches_and_the_legacy_trainer_its_update_key():
    s = read_settings(load_job(PPO, []))
    assert s.critic_packs and s.critic_budget(update=True) == (32768, False)
    old = read_settings(load_job(PPO, ["critic.model.fsdp_config.param_offload=false"]))  # verl <= 0.8's spelling
    assert not old.critic_packs
    plan = plan_job(load_job(PPO, ["critic.model.fsdp_config.param_offload=false"]), parse_gpus(GPUS))
    ov = critic_overrides(plan)
    assert "+critic.ppo_infer_max_token_len_per_gpu" not in ov and ov["critic.ppo_micro_batch_size_per_gpu"] >= 1
    assert "critic update: micro batch" in " ".join(plan.reasons)
    legacy = ["trainer.use_v1=false", "critic.ppo_max_token_len_per_gpu=8192"]
    s = read_settings(load_job(PPO, legacy))
    assert s.critic_budget(update=True) == (8192, True) and s.critic_budget(update=False) == (32768, False)
    ov = critic_overrides(plan_job(load_job(PPO, legacy), parse_gpus(GPUS)))
    assert ov["critic.ppo_max_token_len_per_gpu"] == 8192 and ov["+critic.ppo_infer_max_token_len_per_gpu"] == 32768


def test_packed_critic_micro_batches_are_counted_per_mini_batch():
    """Each mini batch is packed on its own: 16 mini batches of 16 sequences (~8k real tokens, well under 32768)
    are 16 micro batches, never fewer."""
    job = load_job(PPO, ["actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    s = read_settings(job)
    minis = s.sequences // (s.ppo_mini_batch_size * s.n)
    assert minis == 16
    terms = plan_job(job, parse_gpus(GPUS), fill=0.5).terms["time"]["update_critic"]
    assert terms["1/COMPUTE_SHARE"] == 0.0  # the host's side binds at 0.5B (bound() keeps the longer side's terms)
    assert terms["UPDATE_PASS_S"] == minis * 24  # a pass through the 24 layers a packed micro batch
    assert terms["UPDATE_FIXED_RANKS_S"] == 1.0 and terms["UPDATE_FIXED_S"] == 0.0  # 2 ranks: the sharded part


def test_a_critic_micro_batch_that_does_not_divide_is_no_error_where_verl_packs_it():
    """verl 0.9 never splits the critic by its micro batch size, so nothing asserts the division; <= 0.8 did."""
    odd = ["critic.ppo_micro_batch_size_per_gpu=5"]
    assert plan_job(load_job(PPO, odd), parse_gpus(GPUS)).feasible
    old = plan_job(load_job(PPO, odd + ["critic.model.fsdp_config.param_offload=false"]), parse_gpus(GPUS))
    assert not old.feasible and any("critic.ppo_micro_batch_size_per_gpu=5 does not divide" in p for p in old.problems)


def test_both_critic_passes_are_planned_at_the_one_budget_verl_gives_them():
    """7B on 40 GiB cards with 4k responses: the update fits only at 16384 tokens, the values pass would at 32768;
    the v1 trainer reads one key for both, so both are planned (memory and time) at 16384."""
    job = load_job(PPO, ["model.catalog=qwen2.5-7b", "data.max_response_length=4096", "data.train_batch_size=512"])
    plan = plan_job(job, parse_gpus("1x8xA100-40GB"))
    assert plan.feasible
    assert critic_overrides(plan)["+critic.ppo_infer_max_token_len_per_gpu"] == 16384
    reasons = " ".join(plan.reasons)
    assert "critic update: token budget 16384" in reasons and "critic values: token budget 16384" in reasons


def test_a_critic_micro_batch_set_by_the_job_is_said_to_size_nothing():
    plan = plan_job(load_job(PPO, ["critic.ppo_micro_batch_size_per_gpu=2"]), parse_gpus(GPUS))
    said = [w for w in plan.warnings if "critic.ppo_micro_batch_size_per_gpu=2" in w]
    assert said and "verl 0.9 packs them by tokens" in said[0] and "+critic.ppo_infer_max_token_len_per_gpu" in said[0]
    assert not [w for w in plan_job(load_job(PPO, []), parse_gpus(GPUS)).warnings if "packs them" in w]
