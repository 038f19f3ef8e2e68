"""One NVML reader (facts/nvml_node.py) for both node-side scripts: the NVML library replaying recorded machines
(2x H200 with NVLink, 1x H100 with two processes) gives back exactly the GPU facts recorded there, and the node
script's views of the same GPUs; shipped, each script carries the reader's source and runs without this package."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_cluster.diagnostics import probe_node
from verl_cluster.diagnostics.gather import PROBE_SOURCE
from verl_cluster.facts import nvml_node
from verl_cluster.lifecycle import node_script
from verl_cluster.lifecycle.nodes import SCRIPT
from tests.unit.nvml_replay import ReplayedNvml

FACTS = Path(__file__).parents[1] / "fixtures/facts"


def replay(monkeypatch, name, procs=None):
    facts = json.loads((FACTS / name).read_text())
    lib = ReplayedNvml(facts, procs)
    monkeypatch.setattr(nvml_node, "load_library", lambda: lib)
    return facts, lib


@pytest.mark.parametrize("name", ["h200x2_recorded.json", "h100x1.json"])
def test_the_probe_reads_back_what_was_recorded(monkeypatch, name):
    facts, _ = replay(monkeypatch, name)
    gpus, pairs, driver, cuda, error = probe_node.gpus()
    assert gpus == facts["gpus"] and pairs == facts["gpu_pairs"] and error is None
    assert (driver, cuda) == (facts["driver_version"], facts["cuda_version"])


def test_the_node_script_sees_the_same_gpus(monkeypatch):
    facts, _ = replay(monkeypatch, "h200x2_recorded.json")
    gpus, error = node_script.gpus()
    assert error is None
    assert gpus == [{k: g[k] for k in ("index", "name", "memory_total_mib", "memory_free_mib")}
                    for g in facts["gpus"]]


def test_gpu_processes_by_pid(monkeypatch):
    replay(monkeypatch, "h100x1.json", procs={0: [(2113, 24 << 30), (2150, (2**64 - 1))]})
    assert node_script.gpu_procs() == {2113: (0, 24 * 1024), 2150: (0, 0)}  # "not available" counts as 0


def test_no_driver_is_the_same_reason_everywhere(monkeypatch):
    def missing():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(nvml_node, "load_library", missing)
    why = "no NVIDIA driver (libnvidia-ml.so.1 not found)"
    assert probe_node.gpus() == ([], [], None, None, why)
    assert node_script.gpus() == ([], why)
    assert node_script.gpu_procs() == {} and node_script.gpu_faults(1) is None


@pytest.mark.parametrize("source,args,key", [(SCRIPT, ["gpuhealth", "0", "1"], "nvml"),
                                             (PROBE_SOURCE, [], "nvml_error")])
def test_shipped_scripts_carry_the_reader(tmp_path, source, args, key):
    # -I: no site-packages, no current directory: only what was shipped
    r = subprocess.run([sys.executable, "-I", "-c", source, *args], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout.strip().splitlines()[-1].split("@@VC-JSON@@", 1)[1])
    assert key in data
