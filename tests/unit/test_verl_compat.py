"""What verl 0.9 itself needs, learned from running it on a GPU machine (docs/BENCHMARKS.md, "verl for real"):
flash-attn for a critic and for a pinned padding-free path, and micro batches that divide each GPU's batch."""

from dataclasses import replace
from pathlib import Path

from verl_cluster.config.job import load_job
from verl_cluster.facts.model import NodeFacts, from_json
from verl_cluster.submit.preflight import check_flash_attn_needs
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.hardware import flash_status

ROOT = Path(__file__).resolve().parents[2]
RECORDED = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())
# the machine as the first verl runs found it, before the flash-attn kit was staged
H100 = replace(RECORDED, versions={k: v for k, v in RECORDED.versions.items() if k != "flash_attn"})
TINY_BATCH = ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


def test_recorded_h100_flash_attn_status():
    assert flash_status([H100]) == (False, "flash-attn is not installed on vm")
    assert RECORDED.versions["flash_attn"] == "2.8.3" and flash_status([RECORDED])[0] is True
    # with the kit's flash-attn the critic job passes the check that refused it before
    assert check_flash_attn_needs(load_job(ROOT / "launch/gsm8k.yaml"), *flash_status([RECORDED])) == []


def test_a_critic_without_flash_attn_is_refused_before_submission():
    # seen on the H100: the GAE job got through Ray, data and the actor, then the critic's init raised
    # "ImportError: FlashAttention2 has been toggled on ..." (verl hardcodes it for the value model)
    flash, note = flash_status([H100])
    (f,) = check_flash_attn_needs(load_job(ROOT / "launch/gsm8k.yaml"), flash, note)
    assert f.level == "error" and f.check == "verl-config"
    assert f.message.startswith(f"{ROOT}/launch/gsm8k.yaml: algorithm.adv_estimator=gae trains a critic")
    assert "flash_attention_2" in f.message and note in f.message
    assert "adv_estimator=grpo" in f.hint and "install flash-attn" in f.hint
    # GRPO has no critic; unknown flash-attn (hypothetical hardware) and installed flash-attn say nothing
    assert check_flash_attn_needs(load_job(ROOT / "launch/gsm8k_grpo.yaml"), flash, note) == []
    assert check_flash_attn_needs(load_job(ROOT / "launch/gsm8k.yaml"), None, "") == []
    assert check_flash_attn_needs(load_job(ROOT / "launch/gsm8k.yaml"), True, "") == []


def test_a_pinned_padding_free_path_names_where_it_was_pinned(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: x\nentrypoint: verl.trainer.main_ppo\nmodel: {catalog: qwen2.5-0.5b}\n"
                        "overrides:\n  algorithm: {adv_estimator: grpo}\n  actor_rollout_ref:\n    model:\n"
                        "      use_remove_padding: true\n")
    (f,) = check_flash_attn_needs(load_job(job_file), False, "flash-attn is not installed on vm")
    assert f.message.startswith(f"{job_file}:8: actor_rollout_ref.model.use_remove_padding is True")
    assert "varlen" in f.message and f.hint.startswith("remove actor_rollout_ref.model.use_remove_padding")
    cli = load_job(ROOT / "launch/gsm8k_grpo.yaml",
                   ["+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2"])
    (f,) = check_flash_attn_needs(cli, False, "flash-attn is not installed on vm")
    assert f.message.startswith("the command line: +actor_rollout_ref.model.override_config.attn_implementation")
    # false is what the plan would set anyway: nothing to say
    off = load_job(ROOT / "launch/gsm8k_grpo.yaml", ["actor_rollout_ref.model.use_remove_padding=false"])
    assert check_flash_attn_needs(off, False, "flash-attn is not installed on vm") == []


def test_launch_files_leave_the_padding_free_path_to_the_plan():
    for name in ("gsm8k.yaml", "gsm8k_grpo.yaml"):
        assert "actor_rollout_ref.model.use_remove_padding" not in load_job(ROOT / "launch" / name).overrides
    p = plan_job(load_job(ROOT / "launch/gsm8k_grpo.yaml"), [H100])
    assert p.overrides["actor_rollout_ref.model.use_remove_padding"] is False


def test_forward_micro_batches_divide_each_gpus_batch():
    # the tiny GRPO run: 16 prompts x n=5 = 80 sequences on one GPU; the plan said log-prob micro 64 and verl's
    # engine asserted "data size must be divisible by force_group_size * micro_batch_size_per_gpu"
    p = plan_job(load_job(ROOT / "launch/gsm8k_grpo.yaml", TINY_BATCH), [H100])
    assert p.feasible
    for key in ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        assert 80 % p.overrides[key] == 0
    assert 40 % p.overrides["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 0  # 8 x 5 per mini batch


def test_a_pinned_micro_batch_that_does_not_divide_is_a_problem_with_the_fix():
    j = load_job(ROOT / "launch/gsm8k_grpo.yaml",
                 TINY_BATCH + ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64"])
    p = plan_job(j, parse_gpus("1x1xH100-80GB"))
    assert not p.feasible
    assert ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 does not divide the 80 sequences each "
            "data-parallel rank of global_pool gets (verl asserts it does): use 40 or unset it and let the plan choose") in p.problems
