"""Facts recorded on the real GPU machine (2x H200, nvidia-h200-x2, 2026-11-21, record_facts.py, since moved to scripts/calibration/) replayed
through the backend selection, the verdicts and the planner. The hand-entered tests/fixtures/facts/h200x2.json
stays for the check engineer's tests; this file pins what the real recording says."""

import json
from dataclasses import replace
from pathlib import Path

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import load_job
from verl_cluster.diagnostics.backend import select_backend
from verl_cluster.diagnostics.verdicts import ERROR, node_verdicts
from verl_cluster.facts.model import NodeFacts, from_dict, from_json, to_json
from verl_cluster.placement import plan_job

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "facts" / "h200x2_recorded.json"


def recorded(host=None) -> NodeFacts:
    f = from_json(NodeFacts, RECORDED.read_text())
    return replace(f, host=host) if host else f


def test_recording_is_real_and_round_trips():
    raw = json.loads(RECORDED.read_text())
    assert "record_facts.py" in raw["recorded"] and raw["recorded"].startswith("2026-11-21")
    f = from_dict(NodeFacts, raw)
    assert from_json(NodeFacts, to_json(f)) == f
    assert f.python_version == "3.12.3" and f.versions["nccl"] == "2.28.9"
    assert f.versions["torch"].startswith("2.11.0") and f.versions["torch_cuda"] == "13.0"
    assert f.driver_version == "580.159.04" and f.cuda_version == "13.0"


def test_two_h200_with_nvlink_and_peer_access():
    f = recorded()
    assert [g.name for g in f.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert all(g.memory_total_mib == 143771 and g.sm == (9, 0) for g in f.gpus)
    assert all(g.nvlink_links_active == 18 and g.ecc_errors_uncorrected == 0 for g in f.gpus)
    (pair,) = f.gpu_pairs
    assert pair.p2p and pair.nvlink and pair.common_ancestor == "hostbridge"
    assert f.p2p_islands() == [[0, 1]]
    assert not f.rdma_devices and "flash_attn" not in f.versions  # no RDMA, flash-attn not installed there


def test_verdicts_only_warn_about_the_open_file_limit():
    problems = node_verdicts(recorded(), expect_gpus=2)
    assert not [p for p in problems if p.severity == ERROR]
    assert [p.what for p in problems] == ["open-file limit is 20000 (Ray wants >= 65536)"]


def test_backend_is_tcp_and_keeps_peer_to_peer_on():
    # recorded without --head-ip; the live `check` there resolved the route to the local head as lo/127.0.0.1
    f = replace(recorded("localhost"), route_to_head="lo", route_source="127.0.0.1")
    choice = select_backend(load_cluster(ROOT / "cluster_configs" / "local.yaml"), {"localhost": f})
    assert choice.backend == "tcp" and not choice.problems
    # exactly the env `check --json` printed on the GPU machine (docs/BENCHMARKS.md)
    assert choice.env["localhost"] == {"NCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1",
                                       "UCX_TLS": "tcp,sm,self", "UCX_NET_DEVICES": "lo"}
    assert "NCCL_P2P_DISABLE" not in choice.env["localhost"]  # the two GPUs peer over NVLink


def test_planner_on_the_recording_picks_bf16_and_sdpa_because_flash_attn_is_missing():
    p = plan_job(load_job(ROOT / "launch" / "gsm8k.yaml"), [recorded()])
    assert p.feasible and p.dtype == "bfloat16"
    assert p.attn == "sdpa" and any("flash-attn is not installed" in r for r in p.reasons)
    assert (p.nnodes, p.gpus_per_node) == (1, 2)
    assert p.overrides["trainer.n_gpus_per_node"] == 2


def test_planner_allows_flash_attention_when_it_imports():
    f = recorded()
    f = replace(f, versions={**f.versions, "flash_attn": "2.8.3"})
    p = plan_job(load_job(ROOT / "launch" / "gsm8k.yaml"), [f])
    assert p.feasible and p.dtype == "bfloat16" and p.attn == "flash_attention_2"


def test_gpu_smoke_split_plan_on_the_recording_uses_both_gpus():
    p = plan_job(load_job(ROOT / "launch" / "gpu_smoke.yaml"), [recorded()], strategy="split")
    assert p.feasible and p.strategy == "split"
    assert p.role("actor").gpus == ((0, 0),) and p.role("critic").gpus == ((0, 1),)
    assert all(g.peak_gib < 143771 / 1024 for g in p.gpus)
