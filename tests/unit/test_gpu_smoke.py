"""CPU-testable parts of the GPU smoke job (launch/gpu_smoke_job.py): plan -> placement groups and actor slots,
the phase each role runs, and the measured-vs-planned comparison. The GPU part runs on the GPU machine
(scripts/gpu/gpu_e2e.sh; results in docs/BENCHMARKS.md)."""

import importlib.util
import json
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.facts.model import NodeFacts, from_dict
from verl_cluster.placement import parse_gpus, plan_job

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "tests" / "fixtures" / "facts"


def _job_module():
    spec = importlib.util.spec_from_file_location("gpu_smoke_job", ROOT / "launch" / "gpu_smoke_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


smoke = _job_module()


def _h200_facts():
    name = "h200x2_recorded.json" if (FACTS / "h200x2_recorded.json").exists() else "h200x2.json"
    return [from_dict(NodeFacts, json.loads((FACTS / name).read_text()))]


def _plan(strategy=None, facts=None):
    job = load_job(ROOT / "launch" / "gpu_smoke.yaml")
    return plan_job(job, facts or _h200_facts(), strategy=strategy).to_dict()


def test_spec_is_a_ray_command_job_with_every_role():
    job = load_job(ROOT / "launch" / "gpu_smoke.yaml")
    assert job.launcher == "ray" and job.command == ["python", "gpu_smoke_job.py"]
    assert job.env["NCCL_NVLS_ENABLE"] == "0"
    assert job.placement.strategy == "auto"  # the plan picks; env.GPU_SMOKE_STRATEGY forces one
    plan = _plan()
    assert plan["feasible"] and plan["strategy"] == "colocate"  # auto on the 2x H200 recording
    assert set(plan["roles"]) == {"actor", "rollout", "ref", "critic", "reward"}


def test_auto_on_one_gpu_plans_colocate_and_every_role_shares_it():
    """The 1-GPU variant of the recording (h200x2_recorded.json less GPU 1): what failed on an H100 with split."""
    plan = _plan(facts=[from_dict(NodeFacts, json.loads((FACTS / "h200x1_recorded.json").read_text()))])
    assert plan["feasible"] and plan["strategy"] == "colocate"
    assert plan["hardware"]["gpus_per_node"] == 1
    lay = smoke.layout(plan)
    assert [(g["pool"], g["gpus"]) for g in lay["groups"]] == [("global_pool", [0])]
    assert {(a["role"], a["gpu"], a["world"], a["num_gpus"]) for a in lay["actors"]} == {
        (r, 0, 1, 0.25) for r in ("actor", "critic", "ref", "reward")}


def test_split_on_two_gpus_gives_one_group_per_pool_and_separate_gpus():
    plan = _plan("split")
    lay = smoke.layout(plan)
    assert sorted((g["pool"], g["node"], tuple(g["gpus"])) for g in lay["groups"]) == [
        ("actor_rollout_ref_pool", 0, (0,)), ("critic_pool", 0, (1,))]
    assert all(g["bundles"] == [{"GPU": 1, "CPU": 1}] * len(g["gpus"]) for g in lay["groups"])
    by_role = {a["role"]: a for a in lay["actors"]}
    assert set(by_role) == {"actor", "ref", "critic", "reward"}  # rollout is planned, not run
    # actor and ref share GPU 0 (half each), critic and reward share GPU 1
    assert (by_role["actor"]["gpu"], by_role["ref"]["gpu"]) == (0, 0)
    assert (by_role["critic"]["gpu"], by_role["reward"]["gpu"]) == (1, 1)
    assert all(a["num_gpus"] == 0.5 and a["world"] == 1 and a["bundle"] == 0 for a in lay["actors"])
    assert lay["groups"][by_role["actor"]["group"]]["pool"] == "actor_rollout_ref_pool"


def test_colocate_puts_every_role_on_both_gpus_as_an_fsdp_world_of_two():
    plan = _plan("colocate")
    lay = smoke.layout(plan)
    assert len(lay["groups"]) == 1 and lay["groups"][0]["gpus"] == [0, 1]
    for role in ("actor", "critic", "ref", "reward"):
        ranks = [a for a in lay["actors"] if a["role"] == role]
        assert [(a["rank"], a["gpu"], a["world"], a["bundle"]) for a in ranks] == [(0, 0, 2, 0), (1, 1, 2, 1)]
    assert {a["num_gpus"] for a in lay["actors"]} == {0.25}
    # the fractions on one GPU never exceed the bundle's one GPU
    per_gpu = {}
    for a in lay["actors"]:
        per_gpu[(a["node"], a["gpu"])] = per_gpu.get((a["node"], a["gpu"]), 0) + a["num_gpus"]
    assert all(v <= 1.0 + 1e-9 for v in per_gpu.values())


def test_two_nodes_get_one_group_per_pool_and_node():
    plan = _plan("split", parse_gpus("2x2xH100-80GB"))
    lay = smoke.layout(plan)
    keys = sorted((g["pool"], g["node"]) for g in lay["groups"])
    assert keys == sorted(set(keys)) and {g["node"] for g in lay["groups"]} == {0, 1}
    for a in lay["actors"]:
        g = lay["groups"][a["group"]]
        assert g["node"] == a["node"] and g["gpus"][a["bundle"]] == a["gpu"]


def test_work_shape_follows_the_planned_micro_batch_and_length():
    plan = _plan("split")
    assert smoke.work_shape(plan, "actor") == (4, 1024)  # micro 4, prompt 512 + response 512
    assert smoke.role_phase(plan, "actor")["phase"] == "actor update"
    assert smoke.role_phase(plan, "critic")["phase"] == "critic update"
    assert smoke.role_phase(plan, "ref")["phase"] == "ref log-prob"


def test_compare_puts_measured_beside_the_phase_working_set():
    plan = _plan("split")
    actor = smoke.role_phase(plan, "actor")
    measured = [{"role": "actor", "node": 0, "gpu": 0, "physical_gpu": "0",
                 "max_reserved_gib": actor["working_gib"], "max_allocated_gib": actor["working_gib"] * 0.9},
                {"role": "ref", "node": 0, "gpu": 0, "physical_gpu": "0", "max_reserved_gib": 2.0,
                 "max_allocated_gib": 1.5}]
    out = smoke.compare(plan, measured, {(0, 0): 20.0})
    row = out["roles"][0]
    assert row["phase"] == "actor update" and row["error_pct"] == pytest.approx(0.0, abs=0.2)
    gpu0 = next(g for g in out["gpus"] if g["gpu"] == 0)
    assert gpu0["roles_run"] == ["actor", "ref"] and gpu0["nvml_used_gib"] == 20.0
    assert gpu0["measured_sum_reserved_gib"] == pytest.approx(actor["working_gib"] + 2.0, abs=0.01)
    assert gpu0["planned_peak_gib_roles_run"] <= gpu0["planned_peak_gib_all_roles"]  # rollout not run


def test_check_placement_flags_planned_gpus_that_collapse_or_split():
    lay = smoke.layout(_plan("split"))
    good = [dict(a, physical_gpu=str(a["gpu"]), node_ok=True) for a in lay["actors"]]
    assert smoke.check_placement(lay, good) == []
    same = [dict(a, physical_gpu="0", node_ok=True) for a in lay["actors"]]
    assert any("share physical GPUs" in p for p in smoke.check_placement(lay, same))
    split = [dict(a, physical_gpu=str(i), node_ok=True) for i, a in enumerate(lay["actors"])]
    assert any("maps to physical GPUs" in p for p in smoke.check_placement(lay, split))
    away = [dict(a, physical_gpu=str(a["gpu"]), node_ok=False) for a in lay["actors"]]
    assert any("is not on node" in p for p in smoke.check_placement(lay, away))


def test_split_nodes_on_mixed_nodes_puts_each_pool_on_its_own_nodes():
    # node0: a 24 GB card, node1/node2: 80 GB; the actor side must land on node1 and node2 (the job pins each
    # placement group to its node with Ray's node:<ip> resource), the critic/reward pool on node0
    plan = _plan("split-nodes", parse_gpus("1x2xRTX4090-24GB,2x2xH100-80GB"))
    assert plan["strategy"] == "split-nodes"
    lay = smoke.layout(plan)
    nodes = {}
    for g in lay["groups"]:
        nodes.setdefault(g["pool"], set()).add(g["node"])
    assert nodes == {"actor_rollout_ref_pool": {1, 2}, "critic_pool": {0}}
    for a in lay["actors"]:
        g = lay["groups"][a["group"]]
        assert g["node"] == a["node"] and g["gpus"][a["bundle"]] == a["gpu"]
