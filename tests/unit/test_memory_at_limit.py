"""The allocator at the GPU's limit (tests/fixtures/calibration_h100_alloc_limit.json, docs/BENCHMARKS.md): the same
FSDP updates on an H100 80GB with and without expandable segments. With them (as verl 0.9 trains), a step runs when
its live tensors fit (memory.pressure_need); without them the reserved working set is the only safe test."""

import json
from pathlib import Path

import pytest

from verl_cluster.placement import memory as mem
from verl_cluster.placement.memory import GIB, TrainInputs
from verl_cluster.placement.model_shape import catalog_shape

DATA = json.loads((Path(__file__).resolve().parents[1] / "fixtures/calibration_h100_alloc_limit.json").read_text())
ROWS = DATA["rows"]
CAP = 81559 * 2**20  # the H100's memory as torch and the planner's catalog see it (79.6 GiB)


def predict(row):
    shape = catalog_shape(row["model"])
    x = TrainInputs(shape=shape, params=shape.params, n=row["world"], tokens=row["micro"] * row["seq"],
                    micro=row["micro"], seq=row["seq"], c=2, m=4, grad_ckpt=True, attn="sdpa", vocab_out=shape.vocab)
    return mem.update_step(x)


def ids(r):
    return f"{r['model']}-{r['micro']}x{r['seq']}-{'expandable' if r['expandable_segments'] else 'default'}"


def test_fixture_is_the_recorded_run():
    assert DATA["date"] == "2026-11-25" and "H100" in DATA["device"]
    assert len(ROWS) == 22 and sum(r["status"] == "OOM" for r in ROWS) == 6
    # the same cases both ways; two ran only with expandable segments
    ran = {(r["model"], r["micro"], r["seq"]): set() for r in ROWS}
    for r in ROWS:
        if r["status"] == "ok":
            ran[(r["model"], r["micro"], r["seq"])].add(r["expandable_segments"])
    assert sorted(k for k, v in ran.items() if v == {True}) == [("qwen2.5-1.5b", 7, 4096), ("qwen2.5-3b", 2, 8192)]


@pytest.mark.parametrize("row", [r for r in ROWS if r["expandable_segments"]], ids=ids)
def test_with_expandable_segments_the_live_peak_decides(row):
    step = predict(row)
    fits = mem.pressure_need(step.allocated, 0.0) <= CAP
    assert fits == (row["status"] == "ok"), (step.allocated / GIB, mem.pressure_need(step.allocated, 0.0) / GIB)


@pytest.mark.parametrize("row", [r for r in ROWS if r["status"] == "ok"], ids=ids)
def test_live_peak_is_what_torch_allocated(row):
    e = 100.0 * (predict(row).allocated / GIB - row["measured_allocated_gib"]) / row["measured_allocated_gib"]
    assert -1.0 <= e <= 0.5


def test_without_expandable_segments_the_reserved_test_is_the_safe_one():
    default = [r for r in ROWS if not r["expandable_segments"]]
    for r in default:
        if r["status"] == "OOM":  # the reserved working set says no for every case that failed ...
            assert mem.gpu_peak(predict(r).reserved, 0.0) > CAP, ids(r)
    # ... while the live test would have passed the two that ran only with expandable segments
    wrong = [ids(r) for r in default if r["status"] == "OOM" and mem.pressure_need(predict(r).allocated, 0.0) <= CAP]
    assert sorted(wrong) == ["qwen2.5-1.5b-7x4096-default", "qwen2.5-3b-2x8192-default"]


def _plan(job_file, facts, *overrides):
    from verl_cluster.config.job import load_job
    from verl_cluster.placement import parse_gpus, plan_job
    from verl_cluster.facts.model import NodeFacts, from_dict

    root = Path(__file__).resolve().parents[2]
    if facts.endswith(".json"):
        raw = json.loads((root / facts).read_text())
        hw = [from_dict(NodeFacts, n) for n in (raw if isinstance(raw, list) else raw.get("nodes", [raw]))]
    else:
        hw = parse_gpus(facts)
    job = load_job(root / job_file, list(overrides))
    return job, hw, plan_job(job, hw)


def test_what_earlier_phases_left_cached_never_makes_a_phase_fail():
    # GRPO 3B on the recorded H100 with micro 16: the actor update's own working set fits; the ref/old log-prob's
    # cached logits would take it over 79.6 GiB, but the allocator gives cache back before it fails
    _, _, p = _plan("launch/gsm8k_grpo.yaml", "tests/fixtures/facts/h100x1.json", "model.catalog=qwen2.5-3b",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16")
    update = next(ph for r in p.roles for ph in r.phases if ph.phase == "actor update")
    parts = {c.name: c.gib for c in update.components}
    assert p.feasible and "cached from earlier phases" in parts and update.micro_batch == 16
    assert sum(parts.values()) + 1.2 > p.capacity_gib >= sum(v for k, v in parts.items() if k != "cached from earlier phases")
    assert update.peak_gib == pytest.approx(p.capacity_gib) and not update.note and not p.warnings


def test_submit_says_when_its_plan_runs_at_the_limit(monkeypatch):
    """verl's run_qwen3-8b.sh on 8 H100s: submit's preflight note names the phase that runs at the GPU's limit."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.submit import integrations
    from verl_cluster.diagnostics import cluster_facts

    job, hw, p = _plan("tests/fixtures/verl_recipes/run_qwen3-8b.yaml", "1x8xH100-80GB")
    assert p.feasible and any(w.startswith("actor update runs at the GPU's limit") for w in p.warnings)
    monkeypatch.setattr(cluster_facts, "gather_node_facts", lambda spec: hw)
    info = integrations.placement_plan(job, load_cluster(Path(__file__).resolve().parents[2] / "cluster_configs/local.yaml"))
    assert info.feasible is True
    assert "actor update at the GPU's limit (`verl-cluster plan " in info.note and job.source in info.note
