"""After an OOM under a plan that ran a phase at the GPU's limit, `submit --watch` resumes with room
(watch/room.py): the planner's best change that keeps what is trained, written into the run's overrides."""

from dataclasses import replace
from pathlib import Path

from verl_cluster.diagnostics import cluster_facts
from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import ModelSpec, PlacementSpec, load_job
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.options import Option, OptionKind
from verl_cluster.watch.room import ROOM, room_after_oom, same_training

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "tests/fixtures/verl_recipes/run_qwen3-8b.yaml"  # verl's run_qwen3-8b.sh: actor update at the limit
H100 = parse_gpus("1x8xH100-80GB")


def spec():
    return load_cluster(ROOT / "cluster_configs/local.yaml")


def load(path):
    return lambda ov: load_job(path, list(ov))


def test_an_oom_at_the_limit_resumes_with_room_and_says_what_changed(monkeypatch):
    monkeypatch.setattr(cluster_facts, "gather_node_facts", lambda spec: H100)
    new, what = room_after_oom(load(QWEN3), ["trainer.total_epochs=1"], spec())
    assert new[:2] == ["trainer.total_epochs=1", ROOM] and len(new) > 2
    assert what.startswith("actor update ran at the GPU's limit; the next attempts are planned with room: ")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 32 → " in what
    assert "log_prob" not in what  # phases that had room keep the recipe's settings
    # what the next attempt runs: it fits with room, and the batch sizes (what is trained) are the recipe's
    job = load_job(QWEN3, new)
    p = plan_job(job, H100)
    assert p.feasible and not p.warnings
    assert not any("at the GPU's limit" in ph.note for r in p.roles for ph in r.phases)
    for key in ("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.n"):
        assert job.verl_overrides()[key] == load_job(QWEN3).verl_overrides()[key]
    # a second OOM does not change the settings again
    again, why = room_after_oom(load(QWEN3), new, spec())
    assert again == new and why.startswith("already planned with room")


def test_an_oom_with_room_keeps_the_settings(monkeypatch):
    monkeypatch.setattr(cluster_facts, "gather_node_facts", lambda spec: H100)
    gsm8k = ROOT / "launch/gsm8k.yaml"
    assert plan_job(load_job(gsm8k), H100).feasible
    new, what = room_after_oom(load(gsm8k), [], spec())
    assert new == [] and what.startswith("the plan had room for every phase")


def test_changes_that_alter_what_is_trained_are_never_taken():
    def option(kind, change, adds_lora=False):
        return Option((change,), {}, 0.0, "colocate", 1, "none", 0.0, kind, adds_lora=adds_lora)

    assert same_training(option(OptionKind.SETTINGS, "gradient checkpointing on"))
    assert not same_training(option(OptionKind.BATCH, "train/mini batch 256/64 → 288/72"))
    assert not same_training(option(OptionKind.MORE_NODES, "use 16 GPUs"))
    assert not same_training(option(OptionKind.SETTINGS, "LoRA rank 32 on all linear layers", adds_lora=True))
    # the planner's own LoRA option says so (7B PPO on 8 RTX 4090s fits only with LoRA, which the job allows)
    ppo = load_job(ROOT / "launch/gsm8k.yaml")
    lora_job = replace(ppo, model=ModelSpec(catalog="qwen2.5-7b"), placement=PlacementSpec(allow_lora=True))
    first = plan_job(lora_job, parse_gpus("1x8xRTX4090-24GB")).options[0]
    assert first.changes[0].startswith("LoRA rank 32") and first.kind == OptionKind.SETTINGS
    assert first.adds_lora and not same_training(first)


def test_a_program_that_is_not_a_verl_trainer_keeps_its_settings():
    resumable = ROOT / "launch/resumable.yaml"
    new, what = room_after_oom(load(resumable), ["x.y=1"], spec(), facts=H100)
    assert new == ["x.y=1"] and what.startswith("not a verl trainer")
