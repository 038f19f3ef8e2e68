"""Facts narrowed to the GPUs Ray is given (facts/ray_view.py): a node's `gpus:` / the Slurm allocation's count and
its CUDA_VISIBLE_DEVICES, on recorded NVML facts."""

import json
from pathlib import Path

from verl_cluster.config.cluster import load_cluster
from verl_cluster.facts.model import NodeFacts, from_dict
from verl_cluster.facts.ray_view import as_ray_sees, visible_indices
from verl_cluster.diagnostics.cluster_facts import gather_node_facts
from verl_cluster.placement import plan_job
from verl_cluster.config.job import load_job

ROOT = Path(__file__).resolve().parents[2]


def rtx8():
    raw = json.loads((ROOT / "tests/fixtures/facts/rtx4090x8_no_p2p.json").read_text())
    return from_dict(NodeFacts, raw if "gpus" in raw else raw["nodes"][0])


def h200x2():
    raw = json.loads((ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    return from_dict(NodeFacts, raw[0] if isinstance(raw, list) else raw.get("nodes", [raw])[0])


def test_unset_keeps_every_gpu_as_it_is():
    f = rtx8()
    assert as_ray_sees(f, None, {}) is f and visible_indices(f, None, None) == list(range(len(f.gpus)))


def test_a_gpus_cap_takes_the_first_devices():
    f = as_ray_sees(rtx8(), 4, {})
    assert [g.index for g in f.gpus] == [0, 1, 2, 3]
    assert all(p.a < 4 and p.b < 4 for p in f.gpu_pairs) and f.gpu_pairs


def test_cuda_visible_devices_renumbers_from_zero_and_keeps_the_pairs_between_them():
    f0 = h200x2()
    f = as_ray_sees(f0, None, {"CUDA_VISIBLE_DEVICES": "1"})
    assert [g.index for g in f.gpus] == [0] and f.gpus[0].uuid == f0.gpus[1].uuid and not f.gpu_pairs
    by_uuid = as_ray_sees(f0, None, {"CUDA_VISIBLE_DEVICES": f0.gpus[1].uuid})
    assert by_uuid.gpus[0].uuid == f0.gpus[1].uuid
    assert visible_indices(f0, None, "1,0") == [1, 0]
    assert visible_indices(f0, None, "0,7,1") == [0]  # CUDA stops at the first device it cannot find
    assert visible_indices(rtx8(), 2, "6,5,4") == [6, 5]


def test_the_plan_uses_the_gpus_ray_gets(tmp_path, monkeypatch):
    """An 8-GPU box shared with `gpus: 4` in cluster.yaml: plan for 4 GPUs on that node (Ray starts with
    --num-gpus 4, and a plan for 8 would leave verl's placement group waiting forever)."""
    from verl_cluster.diagnostics import gather

    cfg = tmp_path / "c.yaml"
    cfg.write_text("cluster_name: shared\nhead:\n  host: localhost\n  gpus: 4\n")
    spec = load_cluster(cfg)
    monkeypatch.setattr(gather, "gather_facts", lambda spec, runners=None, timeout=90.0: {
        spec.head.host: rtx8()})
    facts = gather_node_facts(spec)
    assert len(facts[0].gpus) == 4
    p = plan_job(load_job(ROOT / "launch/gsm8k.yaml"), facts)
    assert p.overrides["trainer.n_gpus_per_node"] == 4
    assert plan_job(load_job(ROOT / "launch/gsm8k.yaml"), [rtx8()]).overrides["trainer.n_gpus_per_node"] == 8


def test_the_probes_own_cuda_visible_devices_counts_unless_the_node_sets_one():
    from dataclasses import replace

    f = replace(rtx8(), cuda_visible_devices="4,5,6,7")  # e.g. a Slurm step given the last four GPUs
    seen = as_ray_sees(f, None, {})
    assert [g.uuid for g in seen.gpus] == [g.uuid for g in rtx8().gpus[4:]] and [g.index for g in seen.gpus] == [0, 1, 2, 3]
    assert [g.uuid for g in as_ray_sees(f, None, {"CUDA_VISIBLE_DEVICES": "0"}).gpus] == [rtx8().gpus[0].uuid]


def test_the_probe_reports_its_cuda_visible_devices(monkeypatch):
    from verl_cluster.diagnostics import probe_node

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert probe_node.collect(None)["cuda_visible_devices"] == "2,3"
