"""Preflight judgements on recorded probe results and schemas (no cluster needed)."""

import json
from pathlib import Path

import pyarrow as pa

from verl_cluster.config.job import JobSpec
from verl_cluster.submit.data_check import check_schema, requirement_for, schema_tree
from verl_cluster.submit.preflight import NodeGpus, data_files, gpu_fit, gpu_request, judge_node_files

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
VERL_SCHEMA = pa.schema([("data_source", pa.string()), ("prompt", MESSAGES), ("ability", pa.string()),
                         ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
                         ("extra_info", pa.struct([("index", pa.int64())]))])
RAW_GSM8K = pa.schema([("question", pa.string()), ("answer", pa.string())])
PPO = JobSpec(name="t", entrypoint="verl.trainer.main_ppo")


def test_raw_gsm8k_names_file_missing_and_extra_columns():
    req = requirement_for("verl.trainer.main_ppo", {})
    problems = check_schema("/data/train.parquet", schema_tree(RAW_GSM8K), req)
    assert len(problems) == 1
    p = problems[0]
    assert p.startswith("/data/train.parquet: missing columns `prompt`, `data_source`, `reward_model.ground_truth`")
    assert p.endswith("extra columns: answer, question")


def test_verl_schema_passes_and_prompt_key_override_is_used():
    assert check_schema("f", schema_tree(VERL_SCHEMA), requirement_for("verl.trainer.main_ppo", {})) == []
    req = requirement_for("verl.trainer.main_ppo", {"data.prompt_key": "question"})
    problems = check_schema("f", schema_tree(VERL_SCHEMA), req)
    assert problems and "missing column `question`" in problems[0]


def test_prompt_as_plain_string_is_rejected():
    schema = pa.schema([("data_source", pa.string()), ("prompt", pa.string()),
                        ("reward_model", pa.struct([("ground_truth", pa.string())]))])
    problems = check_schema("f.parquet", schema_tree(schema), requirement_for("verl.trainer.main_ppo", {}))
    assert problems == ["f.parquet: column `prompt` is string, verl's RL data needs chat messages: "
                        "list<struct<role,content>>"]


def test_custom_reward_function_needs_no_ground_truth():
    schema = pa.schema([("data_source", pa.string()), ("prompt", MESSAGES)])
    req = requirement_for("verl.trainer.main_ppo", {"custom_reward_function.path": "my_reward.py"})
    assert check_schema("f", schema_tree(schema), req) == []


def test_sft_trainer_needs_messages():
    req = requirement_for("verl.trainer.sft_trainer", {})
    assert req is not None and req.kind == "sft"
    problems = check_schema("sft.parquet", schema_tree(RAW_GSM8K), req)
    assert problems and "missing column `messages`" in problems[0]
    ok = pa.schema([("messages", MESSAGES)])
    assert check_schema("sft.parquet", schema_tree(ok), req) == []
    assert requirement_for("my_module", {}) is None


def test_judge_missing_on_one_node_and_bad_model_dir():
    overrides = {"data.train_files": "/d/train.parquet", "actor_rollout_ref.model.path": "/m"}
    good = {"path": "/d/train.parquet", "exists": True, "size": 10, "parquet": True,
            "schema": schema_tree(VERL_SCHEMA), "rows": 3}
    results = {
        "10.0.0.1": {"data": [good], "model": {"path": "/m", "kind": "dir", "config": True, "tokenizer": ["tokenizer.json"]}},
        "10.0.0.2": {"data": [{"path": "/d/train.parquet", "exists": False}],
                     "model": {"path": "/m", "kind": "dir", "config": False, "tokenizer": []}},
    }
    findings = judge_node_files(PPO, overrides, results)
    errors = [f.message for f in findings if f.level == "error"]
    assert "/d/train.parquet: not found on 10.0.0.2" in errors
    assert "model dir /m on 10.0.0.2 has no config.json or tokenizer files" in errors
    assert len(errors) == 2


def test_judge_unreachable_node_and_not_parquet():
    results = {"a": RuntimeError("boom"),
               "b": {"data": [{"path": "/x.jsonl", "exists": True, "size": 5, "parquet": False}]}}
    msgs = [f.message for f in judge_node_files(PPO, {}, results) if f.level == "error"]
    assert msgs == ["a: cannot check files there: boom", "/x.jsonl on b: not a parquet file"]


def test_hub_model_not_cached_is_a_warning_unless_offline():
    res = {"h": {"data": [], "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "kind": "hub", "cached": False,
                                       "offline": False}}}
    f = judge_node_files(PPO, {}, res)
    assert [x.level for x in f] == ["warning"]
    res["h"]["model"]["offline"] = True
    assert [x.level for x in judge_node_files(PPO, {}, res)] == ["error"]


def test_gpu_fit_ok_short_and_busy():
    nodes = [NodeGpus("a", True, 8, 8), NodeGpus("b", True, 8, 8)]
    assert [f.level for f in gpu_fit(nodes, 8, 2)] == ["ok"]
    short = gpu_fit([NodeGpus("a", True, 8, 8), NodeGpus("b", True, 4, 4)], 8, 2)
    assert short[0].level == "error" and "needs 2 node(s) x 8 GPU(s)" in short[0].message and "b=4" in short[0].message
    busy = gpu_fit([NodeGpus("a", True, 8, 8), NodeGpus("b", True, 8, 0)], 8, 2)
    assert busy[0].level == "error" and "b 0/8 free" in busy[0].message and "verl-cluster stop" in busy[0].hint
    dead = gpu_fit([NodeGpus("a", True, 8, 8), NodeGpus("b", False, 8, 8)], 8, 2)
    assert dead[0].level == "error"


def test_gpu_request_and_data_files_from_overrides():
    assert gpu_request({}) == (8, 1)
    assert gpu_request({"trainer.n_gpus_per_node": 2, "trainer.nnodes": 3}) == (2, 3)
    assert data_files({"data.train_files": ["a", "b"], "data.val_files": "c"}) == ["a", "b", "c"]


def test_check_files_on_this_machine_never_says_both_missing_and_found(tmp_path, monkeypatch):
    """The real node probe on a localhost cluster: a hub model absent from an empty HF cache is a warning,
    and then no 'found on every node' line contradicts it; a real model dir gets the ok line."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.submit.preflight import check_files

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: pf\nhead: {host: localhost}\n")
    spec = load_cluster(c)
    hub = JobSpec(name="j", entrypoint="verl.trainer.main_ppo")
    found = check_files(spec, hub, {"actor_rollout_ref.model.path": "Org/NotCachedModel-0.1B"})
    model = [(f.level, f.message) for f in found if f.check == "model"]
    assert [lvl for lvl, _ in model] == ["warning"], model
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")
    found = check_files(spec, hub, {"actor_rollout_ref.model.path": str(d)})
    assert [f.level for f in found if f.check == "model"] == ["ok"]


# ---- placement strategy on recorded GPU facts (tests/fixtures/facts: the 2x H200 recording, and its 1-GPU variant) ----
ROOT = Path(__file__).resolve().parents[2]
SMOKE, GSM8K = ROOT / "launch/gpu_smoke.yaml", ROOT / "launch/gsm8k.yaml"
ONE_GPU, TWO_GPUS = "h200x1_recorded.json", "h200x2_recorded.json"
SPLIT_ON_ONE = ("placement.strategy is `split`, but split needs >= 2 GPUs: one pool for actor+rollout(+ref), one "
                "for critic/reward; this cluster has 1. Fix: use strategy: auto (the plan picks colocate here)")


def _recorded(name, host=None):
    from verl_cluster.facts.model import NodeFacts, from_dict

    raw = json.loads((ROOT / "tests/fixtures/facts" / name).read_text())
    return [from_dict(NodeFacts, {**raw, "host": host or raw["host"]})]


def _smoke(*cli):
    from verl_cluster.config.job import load_job

    return load_job(SMOKE, list(cli))


def test_strategy_auto_on_one_gpu_is_no_finding():
    from verl_cluster.submit.preflight import check_strategy

    assert _smoke().placement.strategy == "auto"
    assert check_strategy(_smoke(), _recorded(ONE_GPU)) == []


def test_strategy_split_on_one_gpu_is_a_placement_error_naming_field_file_why_and_fix():
    from verl_cluster.submit.preflight import PreflightReport, check_strategy
    from verl_cluster.submit.pipeline import preflight_exit_code

    found = check_strategy(_smoke("placement.strategy=split"), _recorded(ONE_GPU))
    assert [(f.level, f.check, f.message) for f in found] == [("error", "placement", f"{SMOKE}: {SPLIT_ON_ONE}")]
    assert preflight_exit_code(PreflightReport(found)) == 1  # the cluster cannot run it (not bad input)


def test_strategy_split_on_two_gpus_is_fine():
    from verl_cluster.submit.preflight import check_strategy

    found = check_strategy(_smoke("placement.strategy=split"), _recorded(TWO_GPUS))
    assert [(f.level, f.message) for f in found] == [("ok", "placement.strategy split: fits on 1x2x NVIDIA H200")]


def test_gpu_smoke_env_strategy_is_checked_and_wins_over_the_file():
    from verl_cluster.submit.preflight import check_strategy

    (f,) = check_strategy(_smoke("env.GPU_SMOKE_STRATEGY=split"), _recorded(ONE_GPU))
    assert f.level == "error" and f.message.startswith(f"{SMOKE}: env.GPU_SMOKE_STRATEGY is `split`, but split needs >= 2 GPUs")
    assert f.message.endswith("Fix: unset env.GPU_SMOKE_STRATEGY or set it to auto (the plan picks colocate here)")
    assert check_strategy(_smoke("placement.strategy=split", "env.GPU_SMOKE_STRATEGY=auto"), _recorded(ONE_GPU)) == []
    (bad,) = check_strategy(_smoke("env.GPU_SMOKE_STRATEGY=splt"), _recorded(TWO_GPUS))
    assert bad.level == "error" and "`splt`, not a strategy" in bad.message


def test_strategy_that_does_not_fit_while_auto_does_is_an_error():
    """qwen2.5-7b on the 2x H200 recording: split puts the actor's AdamW states on one GPU; colocate shards them."""
    from verl_cluster.submit.preflight import check_strategy

    (f,) = check_strategy(_smoke("placement.strategy=split", "model.catalog=qwen2.5-7b"), _recorded(TWO_GPUS))
    assert f.level == "error" and "placement.strategy is `split`, but split does not fit: actor update" in f.message
    assert f.message.endswith("Fix: use strategy: auto (the plan picks colocate here)")


def test_submit_preflight_runs_the_strategy_check_on_gathered_facts(monkeypatch):
    """run_preflight (what submit calls) gathers the nodes' facts for a self-planning command job."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.diagnostics import gather
    from verl_cluster.submit.preflight import run_preflight

    spec = load_cluster(ROOT / "cluster_configs/local.yaml")
    monkeypatch.setattr(gather, "gather_facts", lambda spec, runners=None, timeout=90.0: {
        spec.head.host: _recorded(ONE_GPU, spec.head.host)[0]})
    report = run_preflight(spec, _smoke("env.GPU_SMOKE_STRATEGY=colocate"), {}, None)
    assert report.ok and [f.message for f in report.findings if f.check == "placement"] == [
        "env.GPU_SMOKE_STRATEGY colocate: fits on 1x1x NVIDIA H200"]
    report = run_preflight(spec, _smoke("placement.strategy=split"), {}, None)
    assert [f.message for f in report.errors] == [f"{SMOKE}: {SPLIT_ON_ONE}"]


def test_verl_trainer_split_on_one_gpu_gets_the_same_message_from_submits_plan(monkeypatch):
    """verl trainers are planned by submit (integrations.placement_plan): its infeasible note is the same line."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.config.job import load_job
    from verl_cluster.diagnostics import gather
    from verl_cluster.submit import integrations
    from verl_cluster.submit.preflight import check_strategy

    spec = load_cluster(ROOT / "cluster_configs/local.yaml")
    monkeypatch.setattr(gather, "gather_facts", lambda spec, runners=None, timeout=90.0: {
        spec.head.host: _recorded(ONE_GPU, spec.head.host)[0]})
    info = integrations.placement_plan(load_job(GSM8K, ["placement.strategy=split"]), spec)
    assert info.feasible is False
    assert info.note == check_strategy(load_job(GSM8K, ["placement.strategy=split"]), _recorded(ONE_GPU))[0].message
    assert info.note.startswith(f"{GSM8K}: placement.strategy is `split`, but verl.trainer.main_ppo maps every role")
    assert integrations.placement_plan(load_job(GSM8K), spec).feasible is True


def test_split_for_verl_main_ppo_is_refused_because_it_puts_every_role_in_one_pool():
    """verl.trainer.main_ppo maps the critic to global_pool: a split plan would not be what verl runs."""
    from dataclasses import replace

    from verl_cluster.config.job import load_job
    from verl_cluster.submit.preflight import check_strategy
    from verl_cluster.placement import plan_job

    job = load_job(GSM8K, ["placement.strategy=split"])
    (f,) = check_strategy(job, _recorded(TWO_GPUS))
    assert f.level == "error" and "maps every role to one resource pool (global_pool)" in f.message
    assert f.message.endswith("Fix: use strategy: auto (the plan picks colocate here)")
    # auto never offers it there, even where a split would be cheaper in memory
    auto = plan_job(load_job(GSM8K, []), _recorded(TWO_GPUS), strategy="auto")
    assert auto.strategy == "colocate" and "split" not in " ".join(auto.reasons)
    # a program that builds two pools may split
    two_pools = replace(load_job(GSM8K, ["placement.strategy=split"]), entrypoint=None,
                        command=["python3", "examples/split_placement/main_ppo_split.py"])
    assert [x.level for x in check_strategy(two_pools, _recorded(TWO_GPUS))] == ["ok"]


def test_strategy_split_nodes_on_one_node_and_on_stock_main_ppo_say_why():
    from verl_cluster.submit.preflight import check_strategy

    (f,) = check_strategy(_smoke("placement.strategy=split-nodes"), _recorded(ONE_GPU))
    assert f.level == "error" and "split-nodes needs >= 2 nodes" in f.message and "this cluster has 1" in f.message
    two = _recorded(TWO_GPUS) + _recorded(TWO_GPUS, host="10.0.0.9")
    (ok,) = check_strategy(_smoke("placement.strategy=split-nodes"), two)  # gpu_smoke builds its own pools
    assert ok.level == "ok" and "split-nodes: fits" in ok.message
    from verl_cluster.config.job import load_job
    (stock,) = check_strategy(load_job(GSM8K, ["placement.strategy=split-nodes"]), two)
    assert stock.level == "error" and "global_pool" in stock.message
