"""Verdicts from recorded facts: each problem names the node and carries a fix."""

from dataclasses import replace
from pathlib import Path

from verl_cluster.diagnostics.verdicts import ERROR, WARNING, consistency_verdicts, mtu_verdicts, node_verdicts
from verl_cluster.facts.model import GpuInfo, NodeFacts, from_json, to_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "facts"


def facts(name: str, host: str | None = None) -> NodeFacts:
    f = from_json(NodeFacts, (FIXTURES / f"{name}.json").read_text())
    return replace(f, host=host) if host else f


def errors(problems):
    return [p for p in problems if p.severity == ERROR]


def test_recorded_h200_box_is_clean():
    f = facts("h200x2")
    assert f.gpus[0].sm == (9, 0) and f.gpus[0].nvlink_links_active == 18
    assert f.p2p_islands() == [[0, 1]]
    assert node_verdicts(f, expect_gpus=2) == []


def test_fixtures_round_trip_through_json():
    for path in FIXTURES.glob("*.json"):
        f = from_json(NodeFacts, path.read_text())
        assert from_json(NodeFacts, to_json(f)) == f, path.name


def test_broken_flash_attn_names_the_abi_and_the_wheel():
    (p,) = errors(node_verdicts(facts("broken_flash_attn")))
    assert "flash-attn does not match this torch ABI" in p.what and "undefined symbol" in p.what
    assert "torch 2.13 with cxx11abiFALSE" in p.fix and "cu12torch2.13cxx11abiFALSE-cp311" in p.fix


def test_p40_warns_about_bf16_and_flash_attn():
    ps = node_verdicts(facts("p40_sm61"))
    (p,) = [p for p in ps if "SM 6.1" in p.what]
    assert p.severity == WARNING
    assert p.fix.startswith("use fp32/eager: GPU is SM 6.1")  # SM < 7.0: eager, as the planner picks


def test_4090_without_p2p_is_a_warning_with_the_env_fix():
    ps = node_verdicts(facts("rtx4090x8_no_p2p"))
    (p,) = [p for p in ps if "cannot all peer" in p.what]
    assert p.severity == WARNING and "NCCL_P2P_DISABLE=1" in p.fix
    assert errors(ps) == []


def test_cpu_machine_says_what_is_missing():
    ps = node_verdicts(facts("cpu_no_torch"))
    whats = " | ".join(p.what for p in ps)
    assert "torch is not installed" in whats and "no GPUs" in whats and "open-file limit is 1024" in whats
    assert errors(ps) == []  # a CPU machine is not wrong by itself ...
    assert errors(node_verdicts(facts("cpu_no_torch"), expect_gpus=8))  # ... unless the config wants GPUs


def test_fewer_gpus_than_configured_and_cpu_torch_on_gpu_node():
    f = replace(facts("h200x2"), versions={"torch": "2.13.0+cpu", "torch_cuda": "", "ray": "2.60.0"})
    whats = [p.what for p in errors(node_verdicts(f, expect_gpus=4))]
    assert any("config says gpus: 4 but NVML sees 2" in w for w in whats)
    assert any("CPU build on a node with GPUs" in w for w in whats)


def test_ecc_busy_gpu_and_clock():
    g = facts("h200x2").gpus
    f = replace(facts("h200x2"), clock_offset_s=3.5,
                gpus=[replace(g[0], ecc_errors_uncorrected=4), replace(g[1], processes=2, memory_free_mib=100)])
    ps = node_verdicts(f)
    assert [p.what for p in errors(ps)] == ["GPU 0 has 4 uncorrected ECC errors"]
    assert any("GPU 1 is in use by 2 process(es)" in p.what for p in ps)
    assert any("clock is +3.50s off the head" in p.what for p in ps)


def test_consistency_gpu_counts_and_versions():
    a, b = facts("h200x2", "a"), facts("rtx4090x8_no_p2p", "b")
    b = replace(b, versions={**b.versions, "ray": "2.59.0"}, python_version="3.10.12")
    ps = consistency_verdicts({"a": a, "b": b})
    whats = [p.what for p in errors(ps)]
    assert any(w.startswith("GPU count differs between nodes (a=2, b=8)") for w in whats)
    assert any(w.startswith("ray differs between nodes: a=2.60.0, b=2.59.0") for w in whats)
    assert any(w.startswith("Python differs") for w in whats)
    assert any("GPU model differs" in p.what for p in ps if p.severity == WARNING)


def test_consistent_cluster_has_no_problems():
    assert consistency_verdicts({"a": facts("h200x2", "a"), "b": facts("h200x2", "b")}) == []


def test_python_patch_difference_is_only_a_warning():
    b = replace(facts("h200x2", "b"), python_version="3.11.9")
    ps = consistency_verdicts({"a": facts("h200x2", "a"), "b": b})
    assert [p.severity for p in ps] == [WARNING]


def test_mtu_mismatch_on_chosen_interfaces():
    a = facts("rdma_ucx", "a")
    b = facts("h200x2", "b")
    ps = mtu_verdicts({"a": a, "b": b}, {"a": "ib0", "b": "eth0"})
    assert len(ps) == 1 and "a=4092, b=1500" in ps[0].what


def test_gpu_sm_parsing():
    assert GpuInfo(0, "x", 1, compute_capability="8.9").sm == (8, 9)


def test_cpu_steal_over_a_tenth_is_a_warning_that_names_it():
    base = facts("h200x2")
    quiet = [p for p in node_verdicts(replace(base, host_python_ms=28.0, host_steal_pct=2.5)) if "hypervisor" in p.what]
    assert quiet == [] and not [p for p in node_verdicts(replace(base, host_steal_pct=None)) if "hypervisor" in p.what]
    got = [p for p in node_verdicts(replace(base, host_python_ms=55.6, host_steal_pct=31.0)) if "hypervisor" in p.what]
    assert len(got) == 1 and got[0].severity == WARNING
    assert "31%" in got[0].what and "55.6 ms" in got[0].what and "dedicated instance" in got[0].fix
    assert "hypervisor" in node_verdicts(replace(base, host_python_ms=None, host_steal_pct=12.0))[-1].what
