"""`check`'s all-reduce bus bandwidth kept with the cluster's state and used by the planner for FSDP traffic:
NCCL only, recent only, for the scope it was measured on (one node's GPUs, or across nodes)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.diagnostics.check import keep_bus
from verl_cluster.diagnostics.collective import CollectiveResult
from verl_cluster.facts import measured_bus
from verl_cluster.diagnostics.cluster_facts import cluster_bus
from verl_cluster.facts.measured_bus import BusMeasure, recorded
from verl_cluster.facts.model import NodeFacts, from_dict
from verl_cluster.placement import plan_job
from verl_cluster.placement import step_time as st
from verl_cluster.placement.lengths import resolve_lengths
from verl_cluster.placement.length_plans import plan_lengths
from verl_cluster.placement.model_shape import catalog_shape
from verl_cluster.placement.settings import read_settings

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "launch/gsm8k_grpo.yaml"
NOW = time.time()


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def h200_node(host: str) -> NodeFacts:
    """The 2x H200 machine's recorded facts, under another host name for a second node."""
    raw = json.loads((ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    return replace(from_dict(NodeFacts, raw), host=host)


def nccl(nodes: int, gbs: float, age_s: float = 3600.0, gpus: int = 4) -> BusMeasure:
    return BusMeasure("gpu-lab", "nccl", nodes, gpus, gpus, gbs, 1 << 30, NOW - age_s)


def results(busbw: list[float]) -> list[dict]:
    sizes = [1 << 20, 64 << 20, 1 << 30]
    return [{"size": s, "time_us": 10.0, "algbw_gbs": b, "busbw_gbs": b, "correct": True} for s, b in zip(sizes, busbw)]


def test_a_check_result_is_kept_and_read_back(tmp_path):
    keep_bus("gpu-lab", CollectiveResult("nccl", True, 16, results([2.0, 9.5, 11.8]), nodes=2))
    keep_bus("gpu-lab", CollectiveResult("gloo", True, 2, results([0.4, 0.9])))  # gloo: one rank per node
    keep_bus("gpu-lab", CollectiveResult("nccl", False, 16, [], error="timed out"))  # a failed run keeps nothing
    got = {m.backend: m for m in recorded("gpu-lab")}
    assert set(got) == {"nccl", "gloo"}
    n = got["nccl"]
    # the largest message size's figure, the group's nodes and GPUs, when
    assert (n.busbw_gbs, n.size_bytes, n.nodes, n.ranks, n.gpus, n.scope) == (11.8, 1 << 30, 2, 16, 16, "network")
    assert abs(n.measured_at - time.time()) < 60
    g = got["gloo"]
    assert (g.busbw_gbs, g.size_bytes, g.nodes, g.gpus) == (0.9, 64 << 20, 2, 0)
    path = tmp_path / "home/.verl-cluster/gpu-lab/collective.json"
    assert json.loads(path.read_text())["nccl"]["busbw_gbs"] == 11.8
    # a newer run replaces its backend's record only
    keep_bus("gpu-lab", CollectiveResult("nccl", True, 2, results([1.0, 100.0, 150.0]), nodes=1))
    got = {m.backend: m for m in recorded("gpu-lab")}
    assert got["nccl"].busbw_gbs == 150.0 and got["nccl"].scope == "node" and got["gloo"].busbw_gbs == 0.9
    assert recorded("other") == ()


def test_a_damaged_record_or_a_path_for_a_name_reads_as_none(tmp_path):
    path = tmp_path / "home/.verl-cluster/gpu-lab/collective.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert recorded("gpu-lab") == ()
    path.write_text(json.dumps({"nccl": {"backend": "nccl", "busbw_gbs": "fast"}}))
    assert recorded("gpu-lab") == ()
    assert measured_bus.state_file("../x") is None and measured_bus.record(replace(nccl(2, 10.0), cluster="../x")) \
        is None


def test_cluster_bus_reads_the_record_of_the_cluster_the_file_names(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("cluster_name: gpu-lab\nhead: {host: localhost}\n")
    assert cluster_bus(str(cfg)) == () and cluster_bus(None) == ()
    measured_bus.record(nccl(2, 11.8))
    assert cluster_bus(str(cfg)) == (nccl(2, 11.8),)


def actor_comm_s(job, n: int, bus_gbs: float) -> float:
    """The actor update's FSDP traffic by hand: micro batches of 20 sequences (the plan's), each layer's bf16 params
    gathered for the forward and the backward, the root once, fp32 grads reduce-scattered."""
    s = read_settings(job)
    micros = math.ceil(s.sequences / n / 20)
    shape = catalog_shape("qwen2.5-7b")
    return st.fsdp_comm_s(shape.params, shape.root_params, 2, n, micros, bus_gbs)


def exposed(p, comm: float) -> float:
    """What the update shows of its FSDP traffic: the part beyond its layers' FLOPs (they overlap)."""
    return max(0.0, comm - st.flops_s(p.terms["time"]["update_actor"]))


def test_a_measured_inter_node_figure_charges_fsdp_traffic_at_it():
    """2.4 GB/s: NCCL over a socket between two nodes (the two-node run of 2026-11-28): the update's traffic is
    longer than its FLOPs and shows."""
    job = load_job(JOB, ["model.catalog=qwen2.5-7b"])
    nodes = [h200_node("gpu1"), h200_node("gpu2")]  # 2 nodes x 2 H200: every group of 4 crosses the network
    assumed = plan_job(job, nodes)
    got = plan_job(job, nodes, bus=(nccl(2, 2.4),))
    for p in (assumed, got):
        assert p.offload == "none" and [ph.micro_batch for ph in p.roles[0].phases][0] == 20
    assert assumed.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(
        exposed(assumed, actor_comm_s(job, 4, st.INTER_NODE_GBS)))
    assert got.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(exposed(got, actor_comm_s(job, 4, 2.4)))
    assert got.terms["time"]["update_actor"]["COMM_S"] > 0
    assert got.time["phases_s"]["update_actor"] > assumed.time["phases_s"]["update_actor"]
    assert "FSDP traffic over 2.4 GB/s, measured by check " in got.time["notes"][0]
    assert "2 nodes, 4 GPUs" in got.time["notes"][0]
    assert assumed.time["notes"] == ["FSDP traffic over an assumed 12.5 GB/s per GPU across nodes: run "
                                     "`verl-cluster check` on the live cluster to measure"]


def test_a_measurement_on_one_node_sets_the_link_within_a_node_only():
    job = load_job(JOB, ["model.catalog=qwen2.5-7b"])
    one = [h200_node("gpu1")]
    catalog = plan_job(job, one)
    got = plan_job(job, one, bus=(nccl(1, 180.0, gpus=2),))
    assert catalog.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(exposed(catalog, actor_comm_s(job, 2, 330)))
    assert got.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(exposed(got, actor_comm_s(job, 2, 180.0)))
    assert catalog.time["notes"] == ["FSDP traffic over 330 GB/s within a node, the GPU catalog's figure for "
                                     "NVIDIA H200"]
    assert got.time["notes"][0].startswith("FSDP traffic over 180.0 GB/s, measured by check ")
    # across nodes a one-node figure says nothing: the network stays assumed
    two = plan_job(job, [h200_node("gpu1"), h200_node("gpu2")], bus=(nccl(1, 180.0, gpus=2),))
    assert two.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(exposed(two, actor_comm_s(job, 4, st.INTER_NODE_GBS)))


def test_gloo_and_old_measurements_are_not_used():
    job = load_job(JOB, ["model.catalog=qwen2.5-7b"])
    nodes = [h200_node("gpu1"), h200_node("gpu2")]
    gloo = BusMeasure("gpu-lab", "gloo", 2, 2, 0, 0.9, 16 << 20, NOW - 60)
    p = plan_job(job, nodes, bus=(gloo,))
    assumed = exposed(p, actor_comm_s(job, 4, st.INTER_NODE_GBS))
    assert p.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(assumed)
    assert any(r.startswith("check measured gloo (CPU) all-reduce only: not used") for r in p.reasons)
    old = plan_job(job, nodes, bus=(nccl(2, 11.8, age_s=8 * 86400), gloo))
    assert old.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(assumed)
    assert any("is 8 days old: not used; run `verl-cluster check` again" in r for r in old.reasons)
    assert "assumed 12.5 GB/s" in old.time["notes"][0]
    # the newest NCCL record counts, a gloo one beside it changes nothing
    fresh = plan_job(job, nodes, bus=(gloo, nccl(2, 2.4)))
    assert fresh.terms["time"]["update_actor"]["COMM_S"] == pytest.approx(exposed(fresh, actor_comm_s(job, 4, 2.4)))


def test_the_note_is_in_the_plan_plan_prints_and_its_json(capsys):
    from rich.console import Console

    from verl_cluster.placement.render import render

    job = load_job(JOB, ["model.catalog=qwen2.5-7b"])
    plans = plan_lengths(job, [h200_node("gpu1"), h200_node("gpu2")], resolve_lengths(job), bus=(nccl(2, 11.8),))
    assert plans.chosen.to_dict()["time"]["notes"][0].startswith("FSDP traffic over 11.8 GB/s, measured by check")
    con = Console(width=200, record=True)
    render(plans.chosen, con, lengths=plans)
    assert "FSDP traffic over 11.8 GB/s, measured by check" in con.export_text()
