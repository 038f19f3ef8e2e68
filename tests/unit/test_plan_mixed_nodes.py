"""Issue 13: mixed nodes and uneven pools. verl's stock trainer puts every role on every node (planned for the
smallest GPU); an entrypoint that builds pools gets the actor side on the larger GPUs (split-nodes), with the
Ray resource that pins each pool; on alike nodes, pools of whole nodes (16 GPUs for the actor, 8 for the critic)."""

from dataclasses import replace
from pathlib import Path

from verl_cluster.config.job import ModelSpec, load_job
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.hardware import hardware_from_facts

ROOT = Path(__file__).resolve().parents[2]
PPO = load_job(ROOT / "launch/gsm8k.yaml")
MIXED = "2x8xA100-80GB,1x8xA10-24GB"


def job(catalog="qwen2.5-3b", entrypoint="verl.trainer.main_ppo", **overrides):
    return replace(PPO, model=ModelSpec(catalog=catalog), entrypoint=entrypoint,
                   overrides={**PPO.overrides, **overrides})


def test_node_kinds_largest_first():
    hw = hardware_from_facts(parse_gpus("1x8xA10-24GB," + "2x8xA100-80GB"))
    assert [len(k.nodes) for k in hw.kinds] == [2, 1] and hw.kinds[0].capacity_bytes > hw.kinds[1].capacity_bytes
    assert hw.kinds[0].nodes == (1, 2) and hw.kinds[1].resource == "gpu_kind_nvidia_a10_22g"
    assert hardware_from_facts(parse_gpus("2x8xA100-80GB")).kinds == ()


def test_stock_trainer_on_mixed_nodes_is_planned_for_the_smallest_gpu_and_says_why():
    p = plan_job(job(), parse_gpus(MIXED))
    assert p.capacity_gib < 23 and any("mixed GPU kinds" in r for r in p.reasons)
    assert not p.feasible and p.binding.startswith("divisibility")  # 256 sequences over 24 GPUs
    pools = [o for o in p.options if o.kind == "pools"]
    assert pools and "needs an entrypoint that builds them" in pools[0].changes[0]


def test_pool_building_entrypoint_gets_the_actor_on_the_large_gpus():
    p = plan_job(job(entrypoint="my_pkg.main_ppo_pools"), parse_gpus(MIXED))
    assert p.feasible and p.strategy == "split-nodes"
    actor = next(x for x in p.pools if x.name == "actor_rollout_ref_pool")
    critic = next(x for x in p.pools if x.name == "critic_pool")
    assert actor.hosts == ("node0", "node1") and actor.gpu_gib == 80.0
    assert critic.hosts == ("node2",) and critic.gpu_gib < 23
    assert actor.ray_resource.startswith("gpu_kind_nvidia_a100") and critic.ray_resource.startswith("gpu_kind_nvidia_a10_")
    # each GPU is held to its own memory: actor GPUs may use more than an A10 has, critic GPUs may not
    by_host = {g.host: g for g in p.gpus}
    assert by_host["node0"].peak_gib > 23 and by_host["node0"].capacity_gib == 80.0
    assert by_host["node2"].peak_gib <= by_host["node2"].capacity_gib < 23
    assert p.overrides["trainer.nnodes"] == 3 and any("Ray resource" in r for r in p.reasons)


def test_the_critic_on_the_small_gpus_runs_at_their_limit_and_the_plan_says_so():
    p = plan_job(job("qwen2.5-7b", entrypoint="my_pkg.main_ppo_pools"), parse_gpus("1x8xH100-80GB,1x8xRTX4090-24GB"))
    assert p.feasible and p.strategy == "split-nodes"
    critic = next(r for r in p.roles if r.role == "critic")
    update = next(ph for ph in critic.phases if ph.phase == "critic update")
    assert update.peak_gib <= 24.0 and "at the GPU's limit" in update.note  # its reserved peak with room is over 24
    assert sum(c.gib for c in update.components) > 24.0
    assert [w for w in p.warnings if w.startswith("critic update runs at the GPU's limit")]
    # the actor side on the H100s has room: nothing of it runs at the limit
    assert not any("at the GPU's limit" in ph.note for r in p.roles if r.role == "actor" for ph in r.phases)


def test_alike_nodes_uneven_pools_16_plus_8():
    p = plan_job(job("qwen2.5-0.5b", entrypoint="my_pkg.main_ppo_pools"), parse_gpus("3x8xH100-80GB"))
    assert p.feasible and p.strategy == "split-nodes"
    assert [(x.name, len(x.hosts), x.ray_resource) for x in p.pools] == [
        ("actor_rollout_ref_pool", 2, ""), ("critic_pool", 1, "")]
