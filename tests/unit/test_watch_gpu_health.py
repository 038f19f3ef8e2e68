"""GPU faults for `watch`: the node script's NVML reading (the NVML library replaying the recorded H100's device
count, name and memory; faults as NVML returns them) and how a report becomes a gpu-fault."""

import json
from pathlib import Path

import pytest

from verl_cluster.errors import RunnerError
from verl_cluster.facts import nvml_node
from verl_cluster.nodes import node_script
from verl_cluster.runners import HostResult
from verl_cluster.watch.gpu_health import judge
from tests.unit.nvml_replay import ReplayedNvml

H100 = json.loads((Path(__file__).parents[1] / "fixtures/facts/h100x1.json").read_text())


@pytest.fixture
def nvml(monkeypatch):
    """NVML answering as the recorded H100 did; tests change `count`, `lost`, `ecc` to inject the fault NVML would
    report."""
    lib = ReplayedNvml(H100)
    monkeypatch.setattr(nvml_node, "load_library", lambda: lib)
    return lib


def test_a_healthy_gpu_has_no_fault(nvml):
    assert node_script.gpu_faults(1) == []


def test_a_gpu_that_fell_off_the_bus_is_a_fault(nvml):
    nvml.count = 0
    assert node_script.gpu_faults(1) == ["NVML sees 0 GPU(s), 1 when the node started (a GPU fell off the bus)"]


def test_gpu_is_lost_and_uncorrected_ecc_are_faults(nvml):
    nvml.lost.add(0)
    assert node_script.gpu_faults(1)[0].startswith("GPU 0: NVMLError_GpuIsLost")
    nvml.lost.clear()
    nvml.ecc[0] = 2
    assert node_script.gpu_faults(1) == ["GPU 0: 2 uncorrected ECC error(s) since the driver loaded"]


def test_no_nvml_means_nothing_to_judge(monkeypatch):
    def fail():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(nvml_node, "load_library", fail)
    assert node_script.gpu_faults(1) is None


def test_a_report_with_a_fault_or_an_xid_line_names_the_node():
    xid = "2025-03-02T10:14:07+0000 gpu-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=2113, GPU has fallen off the bus."
    reports = [HostResult("10.0.0.1", {"faults": [], "xid": []}),
               HostResult("10.0.0.2", error=RunnerError("10.0.0.2", "unreachable")),
               HostResult("10.0.0.3", {"faults": [], "xid": [xid]})]
    ip, ev = judge(reports)
    assert ip == "10.0.0.3" and "Xid (PCI:0000:3b:00): 79" in ev and ev.startswith("kernel: ")
    assert judge(reports[:2]) is None  # unreachable is the node-lost check's business


def test_the_recorded_h100_reading_is_healthy_and_its_machine_has_no_journald():
    rec = json.loads((Path(__file__).parents[1] / "fixtures/gpu_health/h100_gpuhealth.json").read_text())
    assert rec["gpuhealth"]["nvml"] and judge([HostResult("h100", rec["gpuhealth"])]) is None
    assert "DRAM Uncorrectable                         : 0" in \
        (Path(__file__).parents[1] / "fixtures/gpu_health/h100_nvidia_smi_ecc.txt").read_text()
    assert rec["journalctl"] == "command not found"  # why kernel_xids falls back to dmesg


def test_dmesg_xid_lines_count_only_from_the_attempts_start():
    from datetime import datetime, timezone

    lines = ["2026-11-25T03:10:00,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 31, pid=11, Ch 00000008, MMU Fault",
             "2026-11-25T03:36:00,123456+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=2113, GPU has fallen off the bus.",
             "2026-11-25T03:36:01,000000+00:00 nvidia-peermem: unrelated"]
    since = datetime(2026, 11, 25, 3, 30, tzinfo=timezone.utc).timestamp()
    assert node_script.xids_since(lines, since) == [lines[1]]
