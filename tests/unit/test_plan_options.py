"""Issue 13: a job that does not fit as written gets the binding constraint, a fix, and feasible changed plans."""

from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.job import ModelSpec, load_job
from verl_cluster.errors import ConfigError
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.options import batch_shapes
from verl_cluster.placement.settings import read_settings

ROOT = Path(__file__).resolve().parents[2]
PPO = load_job(ROOT / "launch/gsm8k.yaml")
JOB = str(ROOT / "launch/gsm8k.yaml")


def job(catalog=None, **overrides):
    out = replace(PPO, overrides={**PPO.overrides, **overrides})
    return replace(out, model=ModelSpec(catalog=catalog)) if catalog else out


def test_3x8_h100_gsm8k_divisibility_binds_and_options_fit():
    p = plan_job(PPO, parse_gpus("3x8xH100-80GB"))
    assert not p.feasible and p.binding.startswith("divisibility")
    assert p.options and len(p.options) <= 3
    for o in p.options:
        batch = o.overrides.get("data.train_batch_size", 256)
        mini = o.overrides.get("actor_rollout_ref.actor.ppo_mini_batch_size", 64)
        for nodes in o.pool_nodes:  # every verl resource pool (one pool unless the option splits them)
            gpus = nodes * o.overrides["trainer.n_gpus_per_node"]
            assert batch % gpus == 0 and mini % gpus == 0 and batch % mini == 0
        assert o.peak_gib <= p.capacity_gib and o.changes
        # the option, planned as a job of its own, fits (it is not a promise the planner cannot keep)
        again = job(**o.overrides)
        if o.kind == "pools":  # pools by whole nodes need an entrypoint that builds them
            again = replace(again, entrypoint="my_pkg.main_ppo_pools")
        assert plan_job(again, parse_gpus(f"{o.overrides['trainer.nnodes']}x8xH100-80GB")).feasible
    assert any(o.overrides["trainer.nnodes"] == 2 for o in p.options)  # 2 of the 3 nodes
    assert any(o.kind == "pools" and o.pool_nodes == (2, 1) for o in p.options)  # 16 GPUs actor side, 8 critic
    assert any("→ 240/48" in o.changes[0] or "→ 288/72" in o.changes[0] for o in p.options)
    assert p.fixes[0].startswith(p.options[0].changes[0])


def test_batch_shapes_are_the_smallest_changes_that_divide():
    s = read_settings(PPO)
    shapes = batch_shapes(s, 24)
    assert (288, 72) in shapes and (240, 48) in shapes
    assert all(t % 24 == 0 and m % 24 == 0 and t % m == 0 for t, m in shapes)
    grpo = read_settings(job(**{"actor_rollout_ref.rollout.n": 5}))
    assert all(t * 5 % 24 == 0 and m * 5 % 24 == 0 for t, m in batch_shapes(grpo, 24))


def test_memory_binding_names_the_phase_and_more_gpus_fix():
    p = plan_job(job("llama-3.1-70b"), parse_gpus("1x8xH100-80GB"))
    assert not p.feasible and p.binding.startswith("actor update memory: ") and "at the least >" in p.binding
    more = [o for o in p.options if o.kind == "more nodes"]
    assert more and "GPUs" in more[0].changes[0] and more[0].overrides["trainer.nnodes"] > 1
    assert all(o.kind in ("more nodes", "lora (not allowed)") for o in p.options)
    one = plan_job(job("llama-3.1-70b"), parse_gpus("1x1xH100-80GB"))  # rollout weights alone exceed one GPU
    assert not one.options and "GPUs with more memory" in one.fixes[0]


def test_kv_cache_for_one_sequence_binds():
    p = plan_job(job(**{"data.max_response_length": 4_000_000}), parse_gpus("1x1xH100-80GB"))
    assert not p.feasible and p.binding.startswith("KV cache for one sequence")


def test_pinned_micro_batch_is_relaxed_by_an_option():
    j = job("qwen2.5-7b", **{"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 5,
                             "data.train_batch_size": 1024, "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 160})
    p = plan_job(j, parse_gpus("1x8xH100-80GB"))
    assert not p.feasible and p.options
    assert any("ppo_micro_batch_size_per_gpu: 160 →" in c for c in p.options[0].changes)


def test_host_memory_of_hypothetical_nodes_comes_from_the_catalog_or_flag():
    nodes = parse_gpus("1024x8xH100-80GB")
    assert nodes[0].mem_total_mib == 8 * 256 * 1024  # a DGX H100: 2 TiB
    assert parse_gpus("1x8xH100-80GB", host_mem_gib=512)[0].mem_total_mib == 512 * 1024
    assert parse_gpus("1x2x48GB@8.9")[0].mem_total_mib is None  # raw form: unknown
    p = plan_job(job(**{"data.train_batch_size": 8192, "actor_rollout_ref.actor.ppo_mini_batch_size": 8192}),
                 parse_gpus("1024x8xH100-80GB"))
    assert p.host_mem_gib == 2048
    with pytest.raises(ConfigError, match="--host-mem"):
        parse_gpus("1x8xH100-80GB", host_mem_gib=0)


def test_host_memory_binds_when_ram_is_short():
    p = plan_job(PPO, parse_gpus("1x8xH100-80GB", host_mem_gib=8))
    assert not p.feasible and p.binding.startswith("host memory")


def test_cli_answer_first_and_brief(capsys):
    assert main(["plan", JOB, "--gpus", "3x8xH100-80GB"]) == 1
    text = capsys.readouterr().out
    assert text.index("binding constraint") < text.index("fix:") < text.index("feasible plans") < text.index("GPU map")
    assert main(["plan", JOB, "--gpus", "3x8xH100-80GB", "--brief"]) == 1
    brief = capsys.readouterr().out
    assert "binding constraint: divisibility" in brief and "GPU map" not in brief
    assert "data.train_batch_size=" in brief and "trainer.nnodes=2" in brief
    assert main(["plan", JOB, "--gpus", "1x8xH100-80GB", "--brief"]) == 0
    ok = capsys.readouterr().out
    assert ok.splitlines()[0].count("fits") == 1 and "GPU map" not in ok and "trainer.nnodes=1" in ok


def test_cli_host_mem_flag(capsys):
    assert main(["plan", JOB, "--gpus", "1x8xH100-80GB", "--host-mem", "512", "--json"]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["host_mem_gib"] == 512
    assert main(["plan", JOB, "--gpus", "1x8xH100-80GB", "--host-mem", "-1"]) == 2
    assert "--host-mem" in capsys.readouterr().err
